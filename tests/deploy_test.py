#!/usr/bin/python3
"""Checks deploy/ and docker-compose.yml against each other and the code.

  tests/deploy_test.py SOURCE_DIR        (ctest: deploy_test)

- Prometheus: `promtool check config` / `check rules` and `promtool test rules`
  (every alert fires on the series that should trigger it).
- The metric names used by the alert rules, the Grafana dashboard and
  docs/operations.md are names the code exports (server/service/shard_metrics.cc,
  client/worker_metrics.cc); the dashboard is valid JSON with sane panels.
- docker-compose.yml: `docker-compose config` accepts it and it has 2 shards,
  2 trainers pointing at them, Prometheus and Grafana; the Dockerfile is a
  multi-stage Debian bookworm build that runs as a non-root user.
- deploy/k8s: `kubectl kustomize` renders it, and every rendered object has the
  structure the issue asks for (StatefulSet + headless Service, PVC, gRPC
  probes, resources, PDB, non-root read-only containers, ServiceMonitor,
  NetworkPolicy admitting only trainers, Secret, Indexed Job); with more than
  one kubectl (CO2_KUBECTLS=a:b, e.g. Debian's 1.20 and a newer one) every one
  must render the same objects.

Needs python3-yaml, promtool (prometheus), docker-compose and kubectl
(`make deps` installs them). Exits non-zero on the first failing check group
after printing every failure of it.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import yaml

SRC = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
FAILURES = []


def check(condition, message):
    if not condition:
        FAILURES.append(message)
    return condition


def run(args, cwd=SRC, env=None):
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def need(tool):
    path = shutil.which(tool)
    if path is None:
        sys.exit(f"deploy_test: {tool} not found (make deps installs it)")
    return path


def path(*parts):
    return os.path.join(SRC, *parts)


def load_yaml(*parts):
    with open(path(*parts)) as f:
        return yaml.safe_load(f)


# --- The metric names the code exports -------------------------------------

def exported_metrics():
    """Every co2_* series name: base names, plus _bucket/_count/_sum of
    histograms."""
    names, histograms = set(), set()
    for source in ("server/service/shard_metrics.cc", "client/worker_metrics.cc",
                   "common/host_tcp.cc"):
        with open(path(source)) as f:
            text = f.read()
        names |= set(re.findall(
            r'"(co2_(?:aggregator|worker|tcp|link)_[a-z0-9_]+)"', text))
        histograms |= set(re.findall(
            r'(?:BuildHistogram\(\)|AddHistogram\(\s*registry),\s*'
            r'"(co2_[a-z0-9_]+)"', text))
    check(len(names) >= 25, f"found only {len(names)} exported metric names")
    check(len(histograms) >= 5, f"found only {histograms} histograms")
    series = set(names)
    for h in histograms:
        series |= {h + "_bucket", h + "_count", h + "_sum"}
    return series


def used_metrics(text):
    return set(re.findall(r"\bco2_(?:aggregator|worker|tcp|link)_[a-z0-9_]+", text))


def check_names(where, text, exported, required=True):
    used = used_metrics(text)
    check(used or not required, f"{where}: uses no co2 metric at all")
    for name in sorted(used - exported):
        check(False, f"{where}: {name} is not a metric the code exports")
    return used


# --- Prometheus ------------------------------------------------------------

def check_prometheus(exported):
    promtool = need("promtool")
    for args in (["check", "config", "deploy/prometheus/prometheus.yml"],
                 ["check", "rules", "deploy/prometheus/alerts.yml"],
                 ["test", "rules", "deploy/prometheus/alerts_test.yml"]):
        rc, out, err = run([promtool] + args)
        check(rc == 0, f"promtool {' '.join(args)} failed:\n{out}{err}")
    rules = load_yaml("deploy/prometheus/alerts.yml")
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"]}
    for name in ("Co2RoundStuck", "Co2QuorumMisses",
                 "Co2ContributionsRejected", "Co2CheckpointFailing"):
        check(name in alerts, f"alerts.yml: no {name} alert")
    with open(path("docs/operations.md")) as f:
        runbook = f.read()
    for name, rule in alerts.items():
        # Co2AggregatorDown watches `up`, no co2 metric.
        check_names(f"alert {name}", rule["expr"], exported,
                    required=name != "Co2AggregatorDown")
        check(rule.get("labels", {}).get("severity"),
              f"alert {name}: no severity label")
        check(f"#{name.lower()}" in rule["annotations"]["description"],
              f"alert {name}: description does not link its runbook section")
        check(re.search(rf"^#+ .*{name}", runbook, re.M),
              f"docs/operations.md: no section for alert {name}")
    return rules


# --- Grafana ---------------------------------------------------------------

def check_dashboard(exported):
    with open(path("deploy/grafana/co2-dashboard.json")) as f:
        dashboard = json.load(f)
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    check(len(panels) >= 15, f"dashboard: only {len(panels)} panels")
    ids = [p["id"] for p in dashboard["panels"]]
    check(len(ids) == len(set(ids)), "dashboard: duplicate panel ids")
    exprs = []
    for p in panels:
        check(p.get("targets"), f"dashboard panel {p['title']!r}: no targets")
        check(p["datasource"]["uid"] == "${datasource}",
              f"dashboard panel {p['title']!r}: fixed data source")
        g = p["gridPos"]
        check(0 <= g["x"] and g["x"] + g["w"] <= 24,
              f"dashboard panel {p['title']!r}: outside the 24-column grid")
        for t in p.get("targets", []):
            exprs.append(t["expr"])
            # `job` is Prometheus's scrape job; the training job is co2_job.
            check(not re.search(r"(?<![a-z0-9_])job=~\"\$co2_job\"",
                                t["expr"]),
                  f"dashboard panel {p['title']!r}: filters `job` by co2_job")
    used = check_names("dashboard", "\n".join(exprs), exported)
    # Every metric the issue lists has a panel.
    for wanted in ("co2_aggregator_rounds_completed_total",
                   "co2_aggregator_round_duration_seconds_bucket",
                   "co2_aggregator_contribution_chunks_total",
                   "co2_aggregator_late_chunks_total",
                   "co2_aggregator_rejected_chunks_total",
                   "co2_aggregator_bytes_in_total",
                   "co2_aggregator_bytes_out_total",
                   "co2_aggregator_active_workers",
                   "co2_aggregator_quorum_misses_total",
                   "co2_aggregator_checkpoint_duration_seconds_bucket",
                   "co2_aggregator_checkpoint_failures_total",
                   "co2_aggregator_gap_penalty_mean",
                   "co2_aggregator_outer_momentum_norm",
                   "co2_aggregator_clipped_fraction",
                   "co2_worker_inner_step_seconds_bucket",
                   "co2_worker_exposed_comm_seconds_total",
                   "co2_worker_push_seconds_bucket",
                   "co2_worker_bytes_sent_total",
                   "co2_worker_staleness_rounds"):
        check(wanted in used, f"dashboard: no panel shows {wanted}")
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    check({"datasource", "co2_job"} <= variables,
          f"dashboard: template variables {variables}")


# --- docker-compose and the Dockerfile -------------------------------------

def check_dockerfile():
    with open(path("deploy/docker/Dockerfile")) as f:
        lines = [l.strip() for l in f if l.strip() and not l.startswith("#")]
    froms = [l.split()[1] for l in lines if l.upper().startswith("FROM ")]
    check(len(froms) >= 2, f"Dockerfile: not multi-stage ({froms})")
    check(all(f.startswith("debian:bookworm") for f in froms),
          f"Dockerfile: bases {froms} are not Debian bookworm")
    users = [l.split()[1] for l in lines if l.upper().startswith("USER ")]
    check(users and users[-1].split(":")[0] not in ("0", "root"),
          f"Dockerfile: final USER {users} is root")
    last_from = max(i for i, l in enumerate(lines)
                    if l.upper().startswith("FROM "))
    check(any(l.upper().startswith("USER ") for l in lines[last_from:]),
          "Dockerfile: the final stage sets no USER")
    check(any("COPY --from=" in l for l in lines[last_from:]),
          "Dockerfile: the final stage copies nothing from the build stage")
    # The build stage installs the packages the build needs (Makefile).
    text = "\n".join(lines)
    for package in ("libgrpc++-dev", "protobuf-compiler-grpc", "libabsl-dev",
                    "libtorch-dev", "libgloo-dev", "prometheus-cpp-dev"):
        check(package in text, f"Dockerfile: does not install {package}")


def check_compose():
    compose = need("docker-compose")
    env = dict(os.environ)
    env.pop("COMPOSE_FILE", None)
    rc, out, err = run([compose, "-f", "docker-compose.yml", "config"],
                       env=env)
    if not check(rc == 0, f"docker-compose config failed:\n{err}"):
        return
    config = yaml.safe_load(out)
    services = config["services"]
    for name in ("aggregator-0", "aggregator-1", "trainer-0", "trainer-1",
                 "prometheus", "grafana"):
        check(name in services, f"docker-compose: no service {name}")
    shard_ports = {}
    for i in (0, 1):
        s = services.get(f"aggregator-{i}", {})
        args = s.get("command", [])
        check(f"--shard_index={i}" in args and "--num_shards=2" in args,
              f"aggregator-{i}: shard flags {args}")
        check(any(a.startswith("--metrics_port=") for a in args),
              f"aggregator-{i}: no --metrics_port")
        port = next((a.split("=")[1] for a in args
                     if a.startswith("--port=")), "50051")
        shard_ports[i] = port
        check(s.get("read_only") is True, f"aggregator-{i}: not read_only")
    aggregators = ",".join(f"aggregator-{i}:{shard_ports.get(i)}"
                           for i in (0, 1))
    for i in (0, 1):
        s = services.get(f"trainer-{i}", {})
        args = s.get("command", [])
        check(s.get("entrypoint") == ["/usr/local/bin/co2-train"],
              f"trainer-{i}: entrypoint {s.get('entrypoint')}")
        check(f"--aggregators={aggregators}" in args,
              f"trainer-{i}: does not point --aggregators at {aggregators}")
        check(f"--worker={i}" in args and "--workers=2" in args,
              f"trainer-{i}: worker flags {args}")
        # Gloo's barrier between containers: each at its own service name.
        check(f"--group_address=trainer-{i}" in args,
              f"trainer-{i}: --group_address is not its service name")
    build = services.get("aggregator-0", {}).get("build", {})
    check(build.get("dockerfile") == "deploy/docker/Dockerfile",
          f"aggregator-0: builds {build}")
    prometheus = load_yaml("deploy/prometheus/prometheus.yml")
    targets = {t for c in prometheus["scrape_configs"]
               for sc in c["static_configs"] for t in sc["targets"]}
    for i in (0, 1):
        check(f"aggregator-{i}:9464" in targets,
              f"prometheus.yml does not scrape aggregator-{i}")
        check(f"trainer-{i}:9465" in targets,
              f"prometheus.yml does not scrape trainer-{i}")


# --- Kubernetes ------------------------------------------------------------

def kubectls():
    listed = [k for k in os.environ.get("CO2_KUBECTLS", "").split(":") if k]
    return listed or [need("kubectl")]


def render(kubectl, where="deploy/k8s"):
    rc, out, err = run([kubectl, "kustomize", where])
    check(rc == 0, f"{kubectl} kustomize {where} failed:\n{err}")
    return [d for d in yaml.safe_load_all(out) if d] if rc == 0 else []


def flag(args, name):
    for a in args:
        if a == f"--{name}":
            return True
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return None


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v
                                  for k, v in selector.items())


def check_container_security(where, pod_spec, container):
    psc = pod_spec.get("securityContext", {})
    csc = container.get("securityContext", {})
    check(psc.get("runAsNonRoot") is True, f"{where}: runAsNonRoot not set")
    check(psc.get("runAsUser", 0) != 0, f"{where}: runs as uid 0")
    check(csc.get("readOnlyRootFilesystem") is True,
          f"{where}: root filesystem is writable")
    check(csc.get("allowPrivilegeEscalation") is False,
          f"{where}: allows privilege escalation")
    check("ALL" in csc.get("capabilities", {}).get("drop", []),
          f"{where}: keeps capabilities")
    resources = container.get("resources", {})
    check(resources.get("requests", {}).get("cpu") and
          resources.get("requests", {}).get("memory") and
          resources.get("limits", {}).get("memory"),
          f"{where}: resources {resources}")


def check_k8s(rules):
    renders = [(k, render(k)) for k in kubectls()]
    canonical = [sorted(json.dumps(o, sort_keys=True) for o in objs)
                 for _, objs in renders]
    for (k, _), c in zip(renders[1:], canonical[1:]):
        check(c == canonical[0],
              f"{k} renders different objects than {renders[0][0]}")
    objects = renders[0][1]
    if not check(objects, "kustomize rendered nothing"):
        return
    by_kind = {}
    for o in objects:
        for field in ("apiVersion", "kind", "metadata"):
            check(field in o, f"rendered object without {field}: {o}")
        check(o["metadata"].get("name"), f"object without a name: {o}")
        if o["kind"] != "Namespace":
            check(o["metadata"].get("namespace") == "co2",
                  f"{o['kind']}/{o['metadata']['name']}: namespace "
                  f"{o['metadata'].get('namespace')}")
        by_kind.setdefault(o["kind"], []).append(o)
    for kind in ("Namespace", "StatefulSet", "Service", "PodDisruptionBudget",
                 "NetworkPolicy", "ServiceMonitor", "PodMonitor",
                 "PrometheusRule", "Secret", "Job", "PersistentVolumeClaim"):
        check(kind in by_kind, f"k8s: no {kind} rendered")
    if FAILURES:
        return

    secrets = {s["metadata"]["name"]: s for s in by_kind["Secret"]}

    def secret_keys(name):
        s = secrets.get(name, {})
        return set(s.get("data", {})) | set(s.get("stringData", {}))

    # The aggregator StatefulSet.
    sts = by_kind["StatefulSet"][0]
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    pod_labels = spec["template"]["metadata"]["labels"]
    check(selects(spec["selector"]["matchLabels"], pod_labels),
          "StatefulSet: selector does not match its pods")
    (c,) = pod["containers"]
    args = c.get("args", [])
    replicas = spec.get("replicas")
    check(flag(args, "shard_index_from_hostname") is True,
          "StatefulSet: shard index not taken from the pod ordinal")
    check(flag(args, "num_shards") == str(replicas),
          f"StatefulSet: --num_shards={flag(args, 'num_shards')} but "
          f"replicas={replicas}")
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    check(str(ports.get("grpc")) == flag(args, "port"),
          "StatefulSet: grpc port is not --port")
    check(str(ports.get("metrics")) == flag(args, "metrics_port"),
          "StatefulSet: metrics port is not --metrics_port")
    health = flag(args, "health_port")
    for probe in ("readinessProbe", "livenessProbe"):
        p = c.get(probe, {})
        check("grpc" in p, f"StatefulSet: {probe} is not a gRPC probe")
        check(str(p.get("grpc", {}).get("port")) == health,
              f"StatefulSet: {probe} port {p.get('grpc')} is not "
              f"--health_port={health}")
    check_container_security("StatefulSet", pod, c)
    mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
    claims = {t["metadata"]["name"]: t for t in spec.get("volumeClaimTemplates", [])}
    check("data" in claims and mounts.get("data", {}).get("mountPath") ==
          "/var/lib/co2", "StatefulSet: no PVC mounted at /var/lib/co2")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    tls_secret = volumes.get("tls", {}).get("secret", {}).get("secretName")
    check(tls_secret in secrets, f"StatefulSet: TLS secret {tls_secret} "
          "is not rendered")
    tls_dir = mounts.get("tls", {}).get("mountPath", "")
    for name in ("tls_cert", "tls_key", "job_tokens_file"):
        value = flag(args, name)
        if check(isinstance(value, str) and value.startswith(tls_dir + "/"),
                 f"StatefulSet: --{name}={value} not under {tls_dir}"):
            check(value[len(tls_dir) + 1:] in secret_keys(tls_secret),
                  f"StatefulSet: --{name} names a key the Secret lacks")
    for m in mounts.values():
        check(m["name"] in volumes or m["name"] in claims,
              f"StatefulSet: mount {m['name']} has no volume")

    # The headless Service behind the StatefulSet.
    services = {s["metadata"]["name"]: s for s in by_kind["Service"]}
    svc = services.get(spec.get("serviceName"))
    if check(svc, f"StatefulSet: serviceName {spec.get('serviceName')} "
             "is not rendered"):
        check(svc["spec"].get("clusterIP") == "None",
              "aggregator Service is not headless")
        check(selects(svc["spec"]["selector"], pod_labels),
              "aggregator Service does not select the shards")
        svc_ports = {p["name"] for p in svc["spec"]["ports"]}
        check({"grpc", "metrics"} <= svc_ports,
              f"aggregator Service ports {svc_ports}")

    pdb = by_kind["PodDisruptionBudget"][0]
    check(selects(pdb["spec"]["selector"]["matchLabels"], pod_labels),
          "PDB does not select the shards")
    check("maxUnavailable" in pdb["spec"] or "minAvailable" in pdb["spec"],
          "PDB has no budget")

    # The trainer Indexed Job.
    job = by_kind["Job"][0]
    jspec = job["spec"]
    jpod = jspec["template"]["spec"]
    trainer_labels = jspec["template"]["metadata"]["labels"]
    check(jspec.get("completionMode") == "Indexed", "Job is not Indexed")
    (t,) = jpod["containers"]
    targs = t.get("args", [])
    workers = flag(targs, "workers")
    check(str(jspec.get("completions")) == workers and
          str(jspec.get("parallelism")) == workers,
          f"Job: completions/parallelism differ from --workers={workers}")
    check(flag(targs, "worker") == "$(JOB_COMPLETION_INDEX)",
          "Job: --worker is not the completion index")
    env = {e["name"]: e for e in t.get("env", [])}
    check("JOB_COMPLETION_INDEX" in env,
          "Job: JOB_COMPLETION_INDEX is not declared for $(...) expansion")
    # The leaders' start barrier (Gloo) connects pod to pod: each publishes
    # its own address, not the default loopback.
    check(flag(targs, "group_address") == "$(POD_IP)" and
          env.get("POD_IP", {}).get("valueFrom", {}).get("fieldRef", {})
          .get("fieldPath") == "status.podIP",
          "Job: --group_address is not the pod IP (status.podIP)")
    # Per-pod DNS names of the headless Service, fully qualified (the names
    # the shard certificate carries).
    namespace = sts["metadata"]["namespace"]
    expected = ",".join(
        f"{sts['metadata']['name']}-{i}.{spec['serviceName']}.{namespace}.svc:"
        f"{flag(args, 'port')}" for i in range(replicas))
    check(flag(targs, "aggregators") == expected,
          f"Job: --aggregators={flag(targs, 'aggregators')}, want {expected}")
    check_container_security("Job", jpod, t)
    check(jpod.get("restartPolicy") in ("Never", "OnFailure"),
          "Job: restartPolicy")
    tports = {p["name"]: p["containerPort"] for p in t.get("ports", [])}
    check(str(tports.get("metrics")) == flag(targs, "metrics_port"),
          "Job: metrics port is not --metrics_port")
    jvolumes = {v["name"]: v for v in jpod.get("volumes", [])}
    jmounts = {m["name"]: m["mountPath"] for m in t.get("volumeMounts", [])}
    tls_items = {i["path"] for i in
                 jvolumes.get("tls", {}).get("secret", {}).get("items", [])}
    for name in ("aggregator_ca", "aggregator_token_file"):
        value = flag(targs, name)
        check(isinstance(value, str) and
              value == f"{jmounts.get('tls')}/{os.path.basename(value)}" and
              os.path.basename(value) in tls_items,
              f"Job: --{name}={value} is not a file of the mounted Secret")
    pvcs = {p["metadata"]["name"] for p in by_kind["PersistentVolumeClaim"]}
    for v in jvolumes.values():
        if "persistentVolumeClaim" in v:
            check(v["persistentVolumeClaim"]["claimName"] in pvcs,
                  f"Job: claim {v['persistentVolumeClaim']} not rendered")
        if "secret" in v:
            check(v["secret"]["secretName"] in secrets,
                  f"Job: secret {v['secret']} not rendered")

    # Only trainers reach the shards' gRPC port.
    (np,) = by_kind["NetworkPolicy"]
    check(selects(np["spec"]["podSelector"]["matchLabels"], pod_labels),
          "NetworkPolicy does not select the shards")
    check("Ingress" in np["spec"].get("policyTypes", []),
          "NetworkPolicy does not restrict ingress")
    grpc_port = int(flag(args, "port"))
    grpc_rules = [r for r in np["spec"].get("ingress", [])
                  if any(p.get("port") == grpc_port for p in r.get("ports", []))]
    check(grpc_rules, "NetworkPolicy: no rule for the gRPC port")
    for r in grpc_rules:
        sources = r.get("from", [])
        check(sources and all(
            "podSelector" in s and "namespaceSelector" not in s and
            selects(s["podSelector"].get("matchLabels", {}), trainer_labels)
            for s in sources),
            "NetworkPolicy: the gRPC port admits more than the trainers")
    for r in np["spec"].get("ingress", []):
        check(r.get("ports"), "NetworkPolicy: a rule opens every port")

    # Monitoring.
    sm = by_kind["ServiceMonitor"][0]
    check(svc and selects(sm["spec"]["selector"]["matchLabels"],
                          svc["metadata"]["labels"]),
          "ServiceMonitor does not select the aggregator Service")
    check(all(e["port"] in {p["name"] for p in svc["spec"]["ports"]}
              for e in sm["spec"]["endpoints"]),
          "ServiceMonitor endpoint names no Service port")
    pm = by_kind["PodMonitor"][0]
    check(selects(pm["spec"]["selector"]["matchLabels"], trainer_labels),
          "PodMonitor does not select the trainers")
    check(all(e["port"] in tports for e in pm["spec"]["podMetricsEndpoints"]),
          "PodMonitor endpoint names no trainer port")
    pr = by_kind["PrometheusRule"][0]
    check(pr["spec"]["groups"] == rules["groups"],
          "PrometheusRule groups differ from deploy/prometheus/alerts.yml")


LONG_LINK_SYSCTLS = {"net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
                     "net.ipv4.tcp_slow_start_after_idle"}


def check_long_links():
    """deploy/k8s-long-links: the base with the long-link host settings on
    the shards' and trainers' pods, the path they are deployed for in their
    flags, and the node-tuning DaemonSet."""
    objects = render(kubectls()[0], "deploy/k8s-long-links")
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    for key in (("StatefulSet", "co2-aggregator"), ("Job", "co2-trainer")):
        o = by_name.get(key)
        if not check(o, f"deploy/k8s-long-links: no {key}"):
            continue
        spec = o["spec"]["template"]["spec"]
        sysctls = {s["name"] for s in spec.get("securityContext", {}).get("sysctls", [])}
        check(sysctls == LONG_LINK_SYSCTLS,
              f"deploy/k8s-long-links {key}: sysctls {sorted(sysctls)}")
        check(spec["securityContext"].get("runAsNonRoot") is True,
              f"deploy/k8s-long-links {key}: the patch lost runAsNonRoot")
        args = spec["containers"][0]["args"]
        check(flag(args, "link_mbit") and flag(args, "link_rtt"),
              f"deploy/k8s-long-links {key}: no --link_mbit/--link_rtt in {args}")
    tuning = by_name.get(("DaemonSet", "co2-node-tuning"))
    if check(tuning, "deploy/k8s-long-links: no co2-node-tuning DaemonSet"):
        spec = tuning["spec"]["template"]["spec"]
        check(spec.get("hostNetwork") is True and
              spec["containers"][0]["securityContext"].get("privileged") is True,
              "co2-node-tuning must run privileged on the host's network")
        check("tcp_congestion_control" in " ".join(spec["containers"][0]["args"]),
              "co2-node-tuning does not set the congestion control")
        check(tuning["metadata"].get("namespace") == "co2",
              "co2-node-tuning is not in the co2 namespace")


def main():
    exported = exported_metrics()
    rules = check_prometheus(exported)
    check_dashboard(exported)
    with open(path("docs/operations.md")) as f:
        check_names("docs/operations.md", f.read(), exported)
    check_dockerfile()
    check_compose()
    check_k8s(rules)
    check_long_links()
    if FAILURES:
        print("deploy_test: FAILED\n  " + "\n  ".join(FAILURES))
        return 1
    print("deploy_test: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

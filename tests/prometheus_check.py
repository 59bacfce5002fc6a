#!/usr/bin/python3
"""Checks a live Prometheus after a job ran through it.

  prometheus_check.py --url URL [--time UNIX] --src SRC --job JOB
                      [--config deploy/prometheus/prometheus.yml] [--gone]

tests/compose_test.sh runs it inside the Prometheus container's network
namespace (docker-compose.yml's Prometheus), tests/secure_setup_test.sh on
the Prometheus of docs/operations.md's secure setup (--config
deploy/prometheus/local.yml). At --time (a moment the job was running; by default
two scrapes before the last moment a shard reported the job's
rounds, when its workers still ran):
- `up` is 1 for every target of --config, and each target exports
  co2_build_info and the process_* metrics;
- every PromQL expression of deploy/grafana/co2-dashboard.json (Grafana's
  variables replaced as Grafana would: $co2_job by JOB, $__rate_interval by
  four scrape intervals, $__range by the hour before) evaluates without
  error and returns data, and the dashboard's job variable lists JOB;
- every alert rule of deploy/prometheus/alerts.yml evaluates without error,
  and Prometheus reports each rule's own evaluations healthy.
With --gone, also: now, after the job finished, no series names the job.
Prints one line per expression; exits 1 after printing every failure.
"""

import argparse
import json
import os
import sys
import time
import urllib.parse
import urllib.request

import yaml

FAILURES = []


def get(url, path, **params):
    query = urllib.parse.urlencode(params, doseq=True)
    with urllib.request.urlopen(f"{url}{path}?{query}", timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(body.get("error", body))
    return body["data"]


def query(url, expr, at):
    """The instant vector of expr at `at`, or raises with Prometheus' error."""
    try:
        return get(url, "/api/v1/query", query=expr, time=at)["result"]
    except urllib.error.HTTPError as e:  # 400/422: a bad expression
        raise RuntimeError(json.load(e).get("error", str(e))) from None


def last_seen(url, job):
    """The last moment of the past 10 minutes at which Prometheus held a
    shard's count of the job's rounds."""
    now = time.time()
    data = get(url, "/api/v1/query_range",
               query=f'co2_aggregator_rounds_completed_total{{co2_job="{job}"}}',
               start=now - 600, end=now, step=1)
    stamps = sorted({float(t) for series in data["result"] for t, _ in series["values"]})
    if len(stamps) < 2:
        raise SystemExit(f"Prometheus never saw job {job!r} ({len(stamps)} samples)")
    return stamps[-1]


def check(ok, message):
    if not ok:
        FAILURES.append(message)
    print(("ok    " if ok else "FAIL  ") + message)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--time", type=float)
    ap.add_argument("--src", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--config", default="deploy/prometheus/prometheus.yml",
                    help="the Prometheus configuration, relative to --src")
    ap.add_argument("--gone", action="store_true")
    a = ap.parse_args()
    prom = yaml.safe_load(open(os.path.join(a.src, a.config)))
    interval = prom["global"]["scrape_interval"]
    seconds = int(interval.rstrip("s"))
    if a.time is None:
        a.time = last_seen(a.url, a.job) - 2 * seconds

    # Every target scraped while the job ran.
    targets = {(c["job_name"], t) for c in prom["scrape_configs"]
               for sc in c["static_configs"] for t in sc["targets"]}
    up = {(s["metric"]["job"], s["metric"]["instance"]): s["value"][1]
          for s in query(a.url, "up", a.time)}
    for target in sorted(targets):
        check(up.get(target) == "1", f"up{{job={target[0]!r}, "
              f"instance={target[1]!r}}} = {up.get(target)}")

    # What every process exports from its first second (common/
    # process_metrics.h): its build and the process_* metrics.
    for expr in ("co2_build_info", "process_start_time_seconds",
                 "process_cpu_seconds_total", "process_resident_memory_bytes",
                 "process_open_fds", "process_max_fds"):
        got = {(s["metric"]["job"], s["metric"]["instance"])
               for s in query(a.url, expr, a.time)}
        check(targets <= got, f"{expr}: from {len(got & targets)} of "
              f"{len(targets)} targets")

    # The dashboard.
    dashboard = json.load(open(os.path.join(
        a.src, "deploy/grafana/co2-dashboard.json")))
    for var in dashboard.get("templating", {}).get("list", []):
        definition = var.get("definition", "")
        if definition.startswith("label_values("):
            metric, label = [x.strip() for x in
                             definition[len("label_values("):-1].split(",")]
            values = get(a.url, f"/api/v1/label/{label}/values",
                         **{"match[]": metric, "start": a.time - 3600,
                            "end": a.time})
            check(a.job in values,
                  f"variable ${var['name']}: {definition} = {values}")
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            raw = target.get("expr")
            if not raw:
                continue
            expr = (raw.replace("$co2_job", a.job)
                    .replace("$__rate_interval", f"{4 * seconds}s")
                    .replace("$__range", "1h"))
            try:
                result = query(a.url, expr, a.time)
                check(len(result) > 0, f"panel {panel['title']!r}: "
                      f"{len(result)} series: {raw}")
            except RuntimeError as e:
                check(False, f"panel {panel['title']!r}: {raw}: {e}")

    # The alert rules: their expressions now, and Prometheus' own evaluations.
    alerts = yaml.safe_load(open(os.path.join(
        a.src, "deploy/prometheus/alerts.yml")))
    for group in alerts["groups"]:
        for rule in group["rules"]:
            try:
                result = query(a.url, rule["expr"], a.time)
                check(True, f"alert {rule['alert']}: evaluates "
                      f"({len(result)} series firing)")
            except RuntimeError as e:
                check(False, f"alert {rule['alert']}: {e}")
    names = {r["alert"] for g in alerts["groups"] for r in g["rules"]}
    loaded = {r["name"]: r for g in get(a.url, "/api/v1/rules")["groups"]
              for r in g["rules"]}
    for name in sorted(names):
        r = loaded.get(name, {})
        check(r.get("health") == "ok",
              f"alert {name}: Prometheus evaluates it with health "
              f"{r.get('health')} {r.get('lastError', '')}".rstrip())

    if a.gone:
        # Each target drops the job's series at its next scrape after the job
        # ended: wait up to three scrapes for that.
        deadline = time.time() + 3 * seconds
        while True:
            now = query(a.url, f'{{co2_job="{a.job}"}}', time.time())
            if not now or time.time() > deadline:
                break
            time.sleep(0.5)
        check(not now, f"after the job: {len(now)} series name co2_job={a.job!r}: "
              f"{sorted({s['metric']['__name__'] for s in now})}")

    if FAILURES:
        print(f"{len(FAILURES)} Prometheus check(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A job of two workers against co2.local_aggregator(), run by an installed
co2 (tests/wheel_test.sh runs it in a clean container). Each worker trains a
small model for a few rounds; the job passes when both end bit-identical on
the shards' final anchor (finish() checks it against the shards), and the
shard that ran is the binary installed with the package.

    python wheel_job.py             the job (prints one JSON summary line)
    python wheel_job.py worker ...  one worker (started by the job)
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import torch

import co2

TAU, ROUNDS, BATCH = 4, 8, 32


def worker(address: str, index: int) -> None:
    torch.manual_seed(7)  # the same initial model on both workers
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    g = torch.Generator().manual_seed(100 + index)  # each worker its own data
    x = torch.randn(TAU * ROUNDS * BATCH, 16, generator=g)
    y = 0.25 * x.sum(dim=1, keepdim=True)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt = co2.Optimizer(model.parameters(), inner, tau=TAU, rounds=ROUNDS,
                        aggregators=[address], job="wheel", worker_id=f"w{index}",
                        samples_per_step=BATCH)
    # Both workers start at round 0: join, then wait for the job's go.
    opt.connect()
    print("joined", flush=True)
    sys.stdin.readline()
    losses = []
    for step in range(TAU * ROUNDS):
        xb, yb = x[step * BATCH:(step + 1) * BATCH], y[step * BATCH:(step + 1) * BATCH]
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    opt.finish()  # raises unless the final anchor is the shards', bit for bit
    h = hashlib.sha256()
    for p in model.parameters():
        # Bytes without numpy, which torch 2 does not install.
        h.update(bytes(p.detach().contiguous().view(-1).view(torch.uint8).tolist()))
    print(json.dumps({"digest": h.hexdigest(), "first_round_loss": sum(losses[:TAU]) / TAU,
                      "last_round_loss": sum(losses[-TAU:]) / TAU, "round": opt.round}),
          flush=True)


def job() -> int:
    binary = co2.find_aggregator()
    package = os.path.dirname(os.path.abspath(co2.__file__))
    with co2.local_aggregator() as agg:
        procs = [subprocess.Popen([sys.executable, __file__, "worker", agg.addresses[0], str(i)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                 for i in range(2)]
        for p in procs:  # every worker joined (each has its deadline to connect)
            if p.stdout.readline().strip() != "joined":
                print("a worker did not join", file=sys.stderr)
                return 1
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            out, _ = p.communicate(timeout=300)
            if p.returncode != 0:
                print(f"worker exited {p.returncode}", file=sys.stderr)
                return 1
            results.append(json.loads(out.strip().splitlines()[-1]))
    summary = {"torch": torch.__version__, "co2": co2.__version__, "aggregator": binary,
               "workers": results}
    print(json.dumps(summary), flush=True)
    problems = []
    if not binary.startswith(package + os.sep):
        problems.append(f"the shard ran {binary}, not the package's own ({package})")
    if results[0]["digest"] != results[1]["digest"]:
        problems.append("the two workers ended on different models")
    if any(r["round"] != ROUNDS for r in results):
        problems.append(f"a worker did not run {ROUNDS} rounds")
    if any(r["last_round_loss"] >= 0.5 * r["first_round_loss"] for r in results):
        problems.append("a worker's loss did not fall by half from its first round to its last")
    for problem in problems:
        print(f"wheel_job: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(sys.argv[2], int(sys.argv[3]))
        sys.exit(0)
    sys.exit(job())

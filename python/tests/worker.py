"""One worker process of the pytest suite's jobs: trains the Fashion-MNIST CNN
on its share of a small training set and prints one JSON line with what the
tests check (losses, the final parameters' hash, counters, or the error)."""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))
import fashion_mnist  # noqa: E402

import co2  # noqa: E402
from digest import params_digest, params_fnv1a  # noqa: E402


class _ReportingExchange:
    """The optimizer's C++ exchange, reporting {"event": "boundary", "round":
    r} once the worker is inside the boundary call of round r (the call that
    pushes and waits for an update), so that a test knows where it is.

    A thread watches the main thread's innermost frame: that thread runs only
    while the main thread has let go of the GIL, and the main thread lets go
    of it on the line of the call only inside the call (a Python line is
    interrupted only at a call's return or a loop's jump)."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self._round = None
        self._main = threading.main_thread().ident
        lines, first = inspect.getsourcelines(_ReportingExchange.boundary)
        self._call_line = first + next(i for i, line in enumerate(lines)
                                       if "self._inner.boundary(" in line)
        threading.Thread(target=self._report, daemon=True).start()

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def boundary(self, round_: int, *args):
        self._round = round_
        return self._inner.boundary(round_, *args)

    def _report(self) -> None:
        reported = set()
        while True:
            frame = sys._current_frames().get(self._main)
            round_ = self._round
            if (frame is not None and frame.f_code is _ReportingExchange.boundary.__code__
                    and frame.f_lineno == self._call_line and round_ not in reported):
                print(json.dumps({"event": "boundary", "round": round_}), flush=True)
                reported.add(round_)
            time.sleep(0.005)  # a poll period; the process ends this thread


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--aggregators", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--worker", type=int, required=True)
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--algo", default="co2")
    ap.add_argument("--tau", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--update_timeout", type=float, default=60.0)
    ap.add_argument("--uplink_codec", default="fp32")
    ap.add_argument("--eager_share", type=float, default=0.0)
    ap.add_argument("--carry_progress", action=argparse.BooleanOptionalAction,
                    help="unset: co2.Optimizer's default")
    ap.add_argument("--apply", default=None)
    ap.add_argument("--apply_by_step", type=int, default=0)
    ap.add_argument("--stop_after_rounds", type=int, default=0,
                    help="save the optimizer's state_dict to --state after this many "
                         "rounds and stop without finishing (preemption)")
    ap.add_argument("--leave_after_rounds", type=int, default=0,
                    help="leave the job after this many rounds (a job that shrinks)")
    ap.add_argument("--resume", default="",
                    help="rejoin and load the state_dict in this file ({worker}: the index)")
    ap.add_argument("--state", default="", help="where to save it ({worker}: the index)")
    ap.add_argument("--wait_for_go", action="store_true",
                    help="after joining, wait for a line on stdin before training")
    ap.add_argument("--report_boundaries", action="store_true",
                    help='print {"event": "boundary", "round": r} once inside each '
                         "boundary call (the one that waits for an update)")
    args = ap.parse_args()
    args.state = args.state.format(worker=args.worker)
    args.resume = args.resume.format(worker=args.worker)

    torch.manual_seed(1234)  # the same initial model on every worker
    torch.set_num_threads(1)
    x, y = fashion_mnist.load("train")
    steps = args.tau * args.rounds
    share = slice(args.worker, steps * args.batch * args.workers, args.workers)
    x, y = x[share], y[share]
    model = fashion_mnist.Net()
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr)
    result = {"worker": args.worker}
    try:
        opt = co2.Optimizer(model.parameters(), inner, tau=args.tau, rounds=args.rounds,
                            aggregators=args.aggregators.split(","), job=args.job,
                            algo=args.algo, worker_id=f"worker-{args.worker}",
                            samples_per_step=args.batch, update_timeout=args.update_timeout,
                            uplink_codec=args.uplink_codec, eager_share=args.eager_share,
                            carry_progress=args.carry_progress, apply=args.apply,
                            apply_by_step=args.apply_by_step)
        if args.resume:
            opt.load_state_dict(torch.load(args.resume))
        opt.connect()
        if args.report_boundaries:
            opt._exchange = _ReportingExchange(opt._exchange)
        print(json.dumps({"event": "joined", "start_round": opt.round}), flush=True)
        if args.wait_for_go:
            sys.stdin.readline()
        losses = []
        # A worker that joined a running job starts at the step of its round.
        for step in range(opt.round * args.tau, steps):
            xb = x[step * args.batch:(step + 1) * args.batch]
            yb = y[step * args.batch:(step + 1) * args.batch]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if args.stop_after_rounds and step + 1 == args.stop_after_rounds * args.tau:
                torch.save(opt.state_dict(), args.state)
                print(json.dumps({"worker": args.worker, "stopped_at": opt.round}), flush=True)
                return 0
            if args.leave_after_rounds and step + 1 == args.leave_after_rounds * args.tau:
                opt.leave()
                break
        if not opt.left:
            opt.finish()
        result.update(losses=losses, digest=params_digest(model),
                      fnv1a=params_fnv1a(model), stats=opt.stats(),
                      anchor_round=opt.anchor_round, left=opt.left)
    except co2.Error as e:
        result.update(error_code=e.code, error=e.message)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Ctrl-C ends a wait for an update: KeyboardInterrupt, not a hang."""

from __future__ import annotations

import signal
import time

import co2
from conftest import start_worker, wait_for_line, wait_for_live_workers


def test_ctrl_c_ends_a_wait_for_an_update():
    with co2.local_aggregator(num_shards=1) as agg:
        # Worker 1 joins and never trains, so worker 0 waits for the update
        # of round 0 at its second boundary (up to its 60 s update_timeout).
        common = ["--aggregators", ",".join(agg.addresses), "--job", "stuck",
                  "--workers", "2", "--rounds", "50", "--tau", "1", "--wait_for_go"]
        idle = start_worker([*common, "--worker", "1"])
        busy = start_worker([*common, "--worker", "0", "--report_boundaries"])
        for p in (idle, busy):
            wait_for_line(p, '"joined"')
        wait_for_live_workers(agg.addresses, "stuck", 2)
        busy.stdin.write("go\n")
        busy.stdin.flush()
        # Printed once the worker is inside the boundary call of round 1, the
        # call that waits for round 0's update (round 0's does not wait).
        wait_for_line(busy, '{"event": "boundary", "round": 1}')
        assert busy.poll() is None, "the worker should be waiting for round 0's update"
        sent = time.monotonic()
        busy.send_signal(signal.SIGINT)
        _, stderr = busy.communicate(timeout=30)
        took = time.monotonic() - sent
        idle.kill()
        idle.wait(timeout=10)
    assert "KeyboardInterrupt" in stderr, stderr[-2000:]
    # Raised by the boundary call, from inside its wait.
    assert "self._inner.boundary(" in stderr, stderr[-2000:]
    assert busy.returncode != 0
    assert took < 10, f"Ctrl-C took {took:.1f} s to end the wait"


def test_dropping_an_optimizer_whose_shards_are_gone_does_not_wait_out_the_reconnect():
    import gc
    import weakref

    import torch
    with co2.local_aggregator(num_shards=1) as agg:
        w = torch.zeros(1000, requires_grad=True)
        opt = co2.Optimizer([w], torch.optim.SGD([w], lr=0.1), tau=1, rounds=5,
                            aggregators=agg.addresses, job="dropped", connect_timeout=60)
        opt.connect()
        dropped = weakref.ref(opt)
        exchange = weakref.ref(opt._exchange)  # the C++ client with its streams
        assert exchange() is not None
    # The shard is gone and the streams are reconnecting (for up to 60 s);
    # dropping the optimizer destroys its client, which stops them at once.
    start = time.monotonic()
    del opt
    gc.collect()
    took = time.monotonic() - start
    assert dropped() is None, "the optimizer outlived its last reference"
    assert exchange() is None, "the C++ client outlived the optimizer"
    assert took < 10, f"dropping the optimizer took {took:.1f} s"

"""CUDA parameters: Δ and the anchor go through pinned host buffers. Skipped
without a GPU."""

from __future__ import annotations

import pytest
import torch

import co2

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _train(model, opt, x, y, steps, batch):
    for s in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[s * batch:(s + 1) * batch]),
                                                 y[s * batch:(s + 1) * batch])
        loss.backward()
        opt.step()
    opt.finish()
    return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])


def test_cuda_parameters_train_and_end_on_the_shards_anchor():
    torch.manual_seed(0)
    x = torch.randn(16 * 24, 32)
    y = (x[:, 0] > 0).long()
    tau, rounds, batch = 4, 6, 16  # 71,682 parameters: two blocks, two shards
    with co2.local_aggregator(num_shards=2) as agg:
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(32, 2048), torch.nn.ReLU(),
                                    torch.nn.Linear(2048, 2)).cuda()
        inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
        opt = co2.Optimizer(model.parameters(), inner, tau=tau, rounds=rounds,
                            aggregators=agg.addresses, job="cuda")
        cuda_final = _train(model, opt, x.cuda(), y.cuda(), tau * rounds, batch)
        assert opt.anchor_round == rounds + 1
        assert opt.bytes_sent > 0

    # The same job on CPU reaches the same anchor up to the inner steps'
    # device arithmetic.
    with co2.local_aggregator(num_shards=2) as agg:
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(32, 2048), torch.nn.ReLU(),
                                    torch.nn.Linear(2048, 2))
        inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
        opt = co2.Optimizer(model.parameters(), inner, tau=tau, rounds=rounds,
                            aggregators=agg.addresses, job="cpu")
        cpu_final = _train(model, opt, x, y, tau * rounds, batch)
    torch.testing.assert_close(cuda_final, cpu_final, rtol=1e-3, atol=1e-4)


def test_host_params_round_trip_is_exact_on_cuda():
    from co2._params import HostParams
    params = [torch.randn(1000, device="cuda"), torch.randn(7, 3, device="cuda")]
    host = HostParams(params)
    assert host.buffer.is_pinned()
    host.gather()
    expected = torch.cat([p.reshape(-1).cpu() for p in params])
    assert torch.equal(host.buffer, expected)
    host.buffer.mul_(2)
    host.scatter()
    assert torch.equal(torch.cat([p.reshape(-1).cpu() for p in params]), expected * 2)

"""What a PyTorch 2 user does with an optimizer, done with co2.Optimizer: a
learning-rate scheduler, torch.compile, bf16 autocast and bf16 parameters,
a config checked when it is made, the end-of-training state_dict, and the
package's version. Each job here has one worker, in this process, against
its own shard; finish() checks the final anchor against the shard's."""

from __future__ import annotations

import os
import re
import urllib.request
import warnings

import pytest
import torch

import co2

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")


def _data(n: int = 256):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(n, 16, generator=g)
    y = 0.25 * (x @ torch.randn(16, 1, generator=g)) + 0.05 * torch.randn(n, 1, generator=g)
    return x, y


def _model(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 1)).to(dtype)


def _fell(losses: list) -> bool:
    """The last pass over the data (8 batches) lost under 0.6 x the first."""
    return sum(losses[-8:]) < 0.6 * sum(losses[:8])


def _train(opt: co2.Optimizer, forward, steps: int, batch: int = 32, start: int = 0) -> list:
    x, y = _data()
    losses = []
    for step in range(start, start + steps):
        i = (step * batch) % len(x)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(forward(x[i:i + batch]).float(), y[i:i + batch])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _optimizer(model: torch.nn.Module, agg, job: str, *, tau: int = 4, rounds: int = 6,
               lr: float = 1e-2, **kw) -> co2.Optimizer:
    inner = torch.optim.AdamW(model.parameters(), lr=lr)
    return co2.Optimizer(model.parameters(), inner, tau=tau, rounds=rounds,
                         aggregators=agg.addresses, job=job, worker_id="w0", **kw)


def test_an_lr_scheduler_drives_the_wrapper_like_any_optimizer():
    with co2.local_aggregator() as agg:
        model = _model()
        opt = _optimizer(model, agg, "scheduler")
        assert isinstance(opt, torch.optim.Optimizer)
        scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=8, gamma=0.5)
        x, y = _data()
        with warnings.catch_warnings():
            # torch warns when the scheduler steps before the optimizer did.
            warnings.simplefilter("error")
            for step in range(24):
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x[:32]), y[:32]).backward()
                opt.step()
                scheduler.step()
        assert opt.param_groups is opt._inner.param_groups
        assert opt.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.5 ** 3)
        assert opt.state is opt._inner.state and len(opt.state) == 4
        opt.finish()
        assert opt.round == 6


@pytest.mark.skipif(not hasattr(torch, "compile"),
                    reason=f"torch {torch.__version__} has no torch.compile")
def test_a_compiled_model_trains_on_the_parameters_co2_sets():
    with co2.local_aggregator() as agg:
        model = _model()
        compiled = torch.compile(model)
        x, y = _data()
        compiled(x[:32])  # compiled before co2 rebinds the parameters
        opt = _optimizer(model, agg, "compiled")
        losses = _train(opt, compiled, 24)
        opt.finish()
        assert _fell(losses), losses
        # The compiled graph reads the parameters co2 set, not copies taken
        # when it was compiled: its output is the eager model's.
        with torch.no_grad():
            assert torch.allclose(compiled(x), model(x), atol=1e-5)
        assert [p.data_ptr() for p in compiled.parameters()] == \
            [p.data_ptr() for p in model.parameters()]


def test_bf16_autocast_in_the_inner_loop_keeps_float32_parameters():
    with co2.local_aggregator() as agg:
        model = _model()
        opt = _optimizer(model, agg, "autocast")

        def forward(xb: torch.Tensor) -> torch.Tensor:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(xb)
            assert out.dtype == torch.bfloat16
            return out

        losses = _train(opt, forward, 24)
        opt.finish()
        assert _fell(losses), losses
        assert all(p.dtype == torch.float32 for p in model.parameters())


def test_bfloat16_parameters_are_the_float32_anchor_rounded():
    with co2.local_aggregator() as agg:
        model = _model(torch.bfloat16)
        # Without carried progress a round starts at the anchor itself; at
        # α = 1 a lone worker's anchor would be its own bf16 end point.
        opt = _optimizer(model, agg, "bf16-params", carry_progress=False,
                         config=co2.JobConfig(alpha=0.5))
        forward = lambda xb: model(xb.to(torch.bfloat16))  # noqa: E731
        first = _train(opt, forward, 12)  # three rounds
        state = opt.state_dict()
        anchor = state["co2"]["anchor"]
        assert anchor.dtype == torch.float32
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        assert flat.dtype == torch.bfloat16
        # The round starts at the anchor, rounded to the parameters' dtype.
        assert torch.equal(flat, anchor.to(torch.bfloat16))
        assert not torch.equal(anchor, anchor.to(torch.bfloat16).float()), \
            "the anchor holds no more than bf16: nothing shows the mirror is float32"
        rest = _train(opt, forward, 12, start=12)
        opt.finish()
        assert _fell(first + rest), (first, rest)


def test_parameters_of_several_dtypes_are_refused_naming_them():
    model = _model()
    model[2].to(torch.bfloat16)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"several dtypes.*torch.bfloat16.*torch.float32"):
        co2.Optimizer(model.parameters(), inner, tau=1, rounds=1,
                      aggregators=["127.0.0.1:1"], job="mixed")


@pytest.mark.parametrize("field, value", [
    ("alpha", 0.0), ("beta", 1.0), ("clip_value", -1.0), ("min_workers", 0),
    ("momentum", "polyak"), ("alpha", float("nan")),
])
def test_a_bad_config_value_is_a_value_error_when_the_config_is_made(field, value):
    with pytest.raises(ValueError, match=field):
        co2.JobConfig(**{field: value, **({"clip": "value"} if field == "clip_value" else {})})


def test_the_rounds_error_says_what_to_pass():
    w = torch.zeros(4, requires_grad=True)
    with pytest.raises(ValueError, match=r"rounds=math\.ceil\(epochs \* len\(loader\) / tau\)"):
        co2.Optimizer([w], torch.optim.SGD([w], lr=0.1), tau=8,
                      aggregators=["127.0.0.1:1"], job="j")


def test_state_dict_after_finish_is_the_final_state(tmp_path):
    with co2.local_aggregator() as agg:
        model = _model()
        opt = _optimizer(model, agg, "final-state")
        _train(opt, model, 24)
        opt.finish()
        state = opt.state_dict()
    path = tmp_path / "final.pt"
    torch.save({"model": model.state_dict(), "optimizer": state}, path)
    saved = torch.load(path)["optimizer"]
    assert saved["co2"]["finished"] and saved["co2"]["round"] == 6
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert torch.equal(saved["co2"]["anchor"], flat)
    assert saved["inner"]["state"], "the inner optimizer's state is missing"
    again = _optimizer(_model(), agg, "final-state")
    with pytest.raises(ValueError, match="after finish"):
        again.load_state_dict(saved)


def test_the_version_is_cmakes_and_the_shards():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        cmake = re.search(r"project\(co2 VERSION ([0-9.]+)", f.read()).group(1)
    assert co2.__version__ == cmake
    with co2.local_aggregator(extra_args=["--metrics_port=0"]) as agg:
        port = re.search(r"metrics on port (\d+)", agg.log(0)).group(1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            metrics = r.read().decode()
    build_info = re.search(r'co2_build_info\{(?:[^}]*,)?version="([^"]+)"', metrics)
    assert build_info and build_info.group(1) == cmake, metrics[:2000]

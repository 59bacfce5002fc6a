"""The binding: JobConfig fields and rules, and errors as exceptions."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

import co2
from co2 import _core


def test_job_config_has_every_proto_field_with_the_cpp_defaults():
    cpp = _core.default_job_config()
    py = co2.JobConfig().to_dict()
    assert set(py) == set(cpp)
    for name, value in cpp.items():
        if name in ("num_parameters", "num_shards", "rounds", "protocol_version"):
            continue  # filled in by the optimizer
        assert py[name] == pytest.approx(value), name


def test_every_field_round_trips_through_the_proto():
    changed = co2.JobConfig(alpha=0.7, beta=0.9, momentum="delayed_nesterov",
                            momentum_period=6, gap_penalty="gap_aware", penalty_lambda=2.5,
                            clip="adaptive", clip_value=1.5, downlink_codec="bf16",
                            min_workers=3, round_timeout_ms=1234, max_staleness=0, tau=48,
                            rounds=77, num_parameters=1000, num_shards=4, deterministic=True,
                            outlier_ratio=7.5, protocol_version=9)
    values = changed.to_dict()
    assert {f.name for f in dataclasses.fields(co2.JobConfig)} == set(values)
    # Every field off its default, so that one the binding drops shows.
    defaults = co2.JobConfig().to_dict()
    assert [n for n in values if values[n] == defaults[n]] == [], defaults
    back = _core.job_config_round_trip(values)
    assert back.keys() == values.keys()
    for name, value in values.items():
        assert back[name] == pytest.approx(value), name


@pytest.mark.parametrize("field, value, words", [
    ("alpha", -1.0, "alpha"),
    ("beta", 1.5, "beta"),
    ("momentum", "polyak", "momentum"),
    ("clip", "sometimes", "clip"),
    ("downlink_codec", "fp8", "downlink_codec"),
    ("min_workers", -2, "min_workers"),
    ("outlier_ratio", -1.5, r"outlier_ratio must be >= 0 \(0: off\), got -1.5"),
    ("outlier_ratio", float("nan"), "outlier_ratio must be finite"),
])
def test_a_bad_value_is_a_value_error_naming_it(field, value, words):
    with pytest.raises(ValueError, match=words):
        co2.JobConfig(num_parameters=10, num_shards=1, **{field: value})
    # Set after the config was made: validate(), and every optimizer, refuses it.
    config = co2.JobConfig(num_parameters=10, num_shards=1)
    setattr(config, field, value)
    with pytest.raises(ValueError, match=words):
        config.validate()


def test_an_unknown_field_is_a_value_error():
    with pytest.raises(ValueError, match="nesterov_lr"):
        co2.JobConfig.from_dict({"nesterov_lr": 1.0})
    with pytest.raises(ValueError, match="nesterov_lr"):
        _core.job_config_round_trip({"nesterov_lr": 1.0})


def test_a_flag_that_is_not_a_bool_is_a_value_error():
    with pytest.raises(ValueError, match="deterministic must be True or False, got 1"):
        _core.job_config_round_trip({"deterministic": 1})


def test_bad_optimizer_arguments_are_value_errors():
    w = torch.zeros(4, requires_grad=True)
    inner = torch.optim.SGD([w], lr=0.1)
    with pytest.raises(ValueError, match="rounds"):
        co2.Optimizer([w], inner, tau=2, aggregators=["127.0.0.1:1"], job="j")
    with pytest.raises(ValueError, match="algo"):
        co2.Optimizer([w], inner, tau=2, rounds=2, aggregators=["127.0.0.1:1"], job="j",
                      algo="diloco2")
    with pytest.raises(ValueError, match="tau"):
        co2.Optimizer([w], inner, tau=0, rounds=2, aggregators=["127.0.0.1:1"], job="j")
    with pytest.raises(ValueError, match="float32"):
        co2.Optimizer([torch.zeros(2, dtype=torch.float64)], inner, tau=1, rounds=2,
                      aggregators=["127.0.0.1:1"], job="j")
    with pytest.raises(ValueError, match="unknown apply mode 'eager'"):
        co2.Optimizer([w], inner, tau=1, rounds=2, aggregators=["127.0.0.1:1"], job="j",
                      apply="eager")
    with pytest.raises(ValueError, match="apply=arrival is for co2.*localsgd"):
        co2.Optimizer([w], inner, tau=1, rounds=2, aggregators=["127.0.0.1:1"], job="j",
                      algo="localsgd", apply="arrival")
    with pytest.raises(ValueError, match="apply=arrival is not for a deterministic job"):
        co2.Optimizer([w], inner, tau=1, rounds=2, aggregators=["127.0.0.1:1"], job="j",
                      config=co2.JobConfig(deterministic=True), apply="arrival")
    with pytest.raises(ValueError, match="apply_by_step is 4: must be between 1 and tau - 1 = 3"):
        co2.Optimizer([w], inner, tau=4, rounds=2, aggregators=["127.0.0.1:1"], job="j",
                      apply_by_step=4)
    with pytest.raises(ValueError, match="apply_by_step is 1, .* with apply=boundary"):
        co2.Optimizer([w], inner, tau=4, rounds=2, aggregators=["127.0.0.1:1"], job="j",
                      apply="boundary", apply_by_step=1)
    with pytest.raises(ValueError, match="apply_by_step must be an int, got 1.5"):
        co2.Optimizer([w], inner, tau=4, rounds=2, aggregators=["127.0.0.1:1"], job="j",
                      apply_by_step=1.5)
    with pytest.raises(ValueError, match="parameter 1 is parameter 0 again"):
        co2.Optimizer([w, w], inner, tau=1, rounds=2, aggregators=["127.0.0.1:1"], job="j")


def test_parameters_become_views_of_one_flat_tensor_with_their_values():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    before = [p.detach().clone() for p in model.parameters()]
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    co2.Optimizer(model.parameters(), inner, tau=1, rounds=1,
                  aggregators=["127.0.0.1:1"], job="views")
    params = list(model.parameters())
    for p, b in zip(params, before):
        assert torch.equal(p, b) and isinstance(p, torch.nn.Parameter)
    base = params[0].data_ptr()
    offsets = [(p.data_ptr() - base) // 4 for p in params]
    assert offsets == [0, 12, 16, 24]
    model(torch.ones(1, 3)).sum().backward()
    inner.step()
    assert all(p.grad is not None for p in params)


def test_more_shards_than_blocks_is_a_value_error_before_any_call():
    w = torch.zeros(1000, requires_grad=True)
    with pytest.raises(ValueError, match="num_shards 2 is more than the 1 block"):
        co2.Optimizer([w], torch.optim.SGD([w], lr=0.1), tau=1, rounds=1,
                      aggregators=["127.0.0.1:1", "127.0.0.1:2"], job="small")


def test_algorithms_fix_their_settings():
    plain = _core.apply_algo("localsgd", co2.JobConfig(alpha=0.3, beta=0.5).to_dict())
    assert (plain["alpha"], plain["beta"], plain["max_staleness"]) == (1.0, 0.0, 0)
    stale = _core.apply_algo("co2", co2.JobConfig(max_staleness=0).to_dict())
    assert stale["max_staleness"] == 1
    diloco = _core.apply_algo("diloco", co2.JobConfig(max_staleness=1).to_dict())
    assert (diloco["max_staleness"], diloco["momentum"]) == (0, "nesterov")


def test_co2_applies_on_arrival_unless_deterministic_or_told():
    w = torch.zeros(4, requires_grad=True)
    inner = torch.optim.SGD([w], lr=0.1)

    def apply(**kwargs):
        return co2.Optimizer([w], inner, tau=2, rounds=2, aggregators=["127.0.0.1:1"],
                             job="j", **kwargs).apply

    assert apply() == "arrival"
    assert apply(config=co2.JobConfig(deterministic=True)) == "boundary"
    assert apply(algo="localsgd") == "boundary"
    assert apply(apply="boundary") == "boundary"


def test_co2s_defaults_are_the_plain_average_with_carried_progress():
    w = torch.zeros(4, requires_grad=True)
    inner = torch.optim.SGD([w], lr=0.1)

    def make(**kwargs):
        return co2.Optimizer([w], inner, tau=2, rounds=2, aggregators=["127.0.0.1:1"],
                             job="j", **kwargs)

    opt = make()
    assert (opt.config.alpha, opt.config.beta, opt.config.momentum) == (1.0, 0.0, "heavy_ball")
    assert (opt.carry_progress, opt.apply) == (True, "arrival")
    assert co2.JobConfig().alpha == 1.0
    assert not make(eager_share=0.25).carry_progress
    assert not make(algo="localsgd").carry_progress
    assert not make(algo="diloco").carry_progress
    assert not make(carry_progress=False).carry_progress
    with pytest.raises(ValueError, match="eager_share=0.25"):
        make(eager_share=0.25, carry_progress=True)
    with pytest.raises(ValueError, match="algo='localsgd'"):
        make(algo="localsgd", carry_progress=True)


def test_diloco_runs_its_published_outer_settings_unless_given():
    w = torch.zeros(4, requires_grad=True)
    inner = torch.optim.SGD([w], lr=0.1)
    opt = co2.Optimizer([w], inner, tau=2, rounds=2, aggregators=["127.0.0.1:1"],
                        job="j", algo="diloco")
    assert (opt.config.alpha, opt.config.beta) == pytest.approx((0.7, 0.9))
    assert (opt.config.momentum, opt.config.max_staleness) == ("nesterov", 0)
    given = co2.Optimizer([w], inner, tau=2, rounds=2, aggregators=["127.0.0.1:1"],
                          job="j", algo="diloco", config=co2.JobConfig(alpha=0.4, beta=0.5))
    assert (given.config.alpha, given.config.beta) == pytest.approx((0.4, 0.5))


def test_a_server_refusal_arrives_as_co2_error_with_its_code():
    with co2.local_aggregator(num_shards=1) as agg:
        a = torch.zeros(100, requires_grad=True)
        first = co2.Optimizer([a], torch.optim.SGD([a], lr=0.1), tau=1, rounds=2,
                              aggregators=agg.addresses, job="refusal", worker_id="w0")
        first.connect()
        b = torch.zeros(50, requires_grad=True)  # another model size
        second = co2.Optimizer([b], torch.optim.SGD([b], lr=0.1), tau=1, rounds=2,
                               aggregators=agg.addresses, job="refusal", worker_id="w1")
        with pytest.raises(co2.Error) as info:
            second.connect()
        assert info.value.code == "FAILED_PRECONDITION"
        assert "num_parameters" in info.value.message
        del first


def test_no_shard_is_a_co2_error_not_a_hang():
    w = torch.zeros(4, requires_grad=True)
    opt = co2.Optimizer([w], torch.optim.SGD([w], lr=0.1), tau=1, rounds=1,
                        aggregators=["127.0.0.1:1"], job="nobody", connect_timeout=2)
    with pytest.raises(co2.Error) as info:
        opt.connect()
    assert info.value.code in ("DEADLINE_EXCEEDED", "UNAVAILABLE")
    # The optimizer is unusable after the error, and says so.
    with pytest.raises(co2.Error, match="after an error"):
        opt.step()


def test_help_shows_the_api():
    import pydoc
    text = pydoc.render_doc(co2.Optimizer)
    for words in ("aggregators", "tau", "state_dict", "load_state_dict", "finish",
                  "co2.Error"):
        assert words in text, words
    assert "alpha" in pydoc.render_doc(co2.JobConfig)


def test_check_host_tcp_warns_where_the_settings_cap_the_path():
    # No socket buffer moves 100 Gbit/s over a 1 s round trip: a warning
    # naming what one stream may move.
    with pytest.warns(co2.HostTcpWarning, match="one stream"):
        line = co2.check_host_tcp(100000, 1.0)
    assert "100000 Mbit/s" in line
    # Without a round trip nothing caps a window.
    with warnings.catch_warnings():
        warnings.simplefilter("error", co2.HostTcpWarning)
        co2.check_host_tcp(100, 0)
    with pytest.raises(ValueError, match="link_rtt must be >= 0 .seconds., got -0.1"):
        co2.check_host_tcp(100, -0.1)
    with pytest.raises(ValueError, match="link_mbit must be >= 0"):
        co2.check_host_tcp(float("nan"), 0.1)
    with pytest.raises(ValueError, match="link_rtt must be >= 0 .seconds., got inf"):
        co2.check_host_tcp(100, float("inf"))


def test_the_optimizer_checks_the_hosts_tcp_for_its_link_at_connect():
    w = torch.zeros(100, requires_grad=True)
    inner = torch.optim.SGD([w], lr=0.1)
    with pytest.raises(ValueError, match="link_mbit must be a number >= 0, got -1"):
        co2.Optimizer([w], inner, tau=1, rounds=2, aggregators=["127.0.0.1:1"], job="j",
                      link_mbit=-1)
    with pytest.raises(ValueError, match="link_rtt must be a number >= 0, got inf"):
        co2.Optimizer([w], inner, tau=1, rounds=2, aggregators=["127.0.0.1:1"], job="j",
                      link_rtt=float("inf"))
    with co2.local_aggregator(num_shards=1) as agg:
        opt = co2.Optimizer([w], inner, tau=1, rounds=2, aggregators=agg.addresses,
                            job="link", link_mbit=100000, link_rtt=1.0)
        with pytest.warns(co2.HostTcpWarning, match="100000 Mbit/s"):
            opt.connect()

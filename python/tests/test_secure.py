"""mTLS, a job token and lossy codecs, from Python."""

from __future__ import annotations

import os
import subprocess

import pytest
import torch

import co2

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    subprocess.run([os.path.join(ROOT, "scripts", "make-certs.sh"), str(d), "--worker", "0",
                    "--job", "secure"], check=True, capture_output=True, timeout=120)
    return d


def _train(agg, certs, token_file, **kwargs):
    torch.manual_seed(0)
    model = torch.nn.Linear(300, 256)  # 77,056 parameters: two blocks
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = co2.Optimizer(model.parameters(), inner, tau=2, rounds=3,
                        aggregators=[a.replace("127.0.0.1", "localhost") for a in agg.addresses],
                        job="secure", ca_file=str(certs / "ca.crt"),
                        cert_file=str(certs / "worker-0.crt"),
                        key_file=str(certs / "worker-0.key"), token_file=token_file,
                        connect_timeout=20, **kwargs)
    x = torch.randn(12, 300)
    for i in range(6):
        opt.zero_grad()
        model(x[2 * i:2 * i + 2]).square().mean().backward()
        opt.step()
    opt.finish()
    return opt


def test_mtls_a_token_and_lossy_codecs(certs):
    with co2.local_aggregator(num_shards=2, tls_cert=str(certs / "shard.crt"),
                              tls_key=str(certs / "shard.key"),
                              tls_client_ca=str(certs / "ca.crt"),
                              job_tokens_file=str(certs / "job-tokens")) as agg:
        opt = _train(agg, certs, str(certs / "token"), uplink_codec="int8",
                     config=co2.JobConfig(downlink_codec="bf16"))
    assert opt.anchor_round == 4  # finished, and verified against the shards
    # int8 up: 1 byte per element and a scale per 1,024-element block.
    assert opt.bytes_sent < 3 * 77056 * 1.01


def test_a_wrong_token_is_refused_with_a_reason(certs, tmp_path):
    wrong = tmp_path / "wrong-token"
    wrong.write_text("not-the-token\n")
    wrong.chmod(0o600)
    with co2.local_aggregator(num_shards=1, tls_cert=str(certs / "shard.crt"),
                              tls_key=str(certs / "shard.key"),
                              tls_client_ca=str(certs / "ca.crt"),
                              job_tokens_file=str(certs / "job-tokens")) as agg:
        with pytest.raises(co2.Error) as info:
            _train(agg, certs, str(wrong))
    assert info.value.code in ("UNAUTHENTICATED", "PERMISSION_DENIED"), info.value

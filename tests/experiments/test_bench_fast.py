"""``bench --mode fastpath``: eager vs compiled, fp32 vs bf16, peers and MFU in one interleaved run."""

import pytest
import torch

from coupled_qk.experiments.bench import fast
from coupled_qk.experiments.bench.cost_curve import train_step_flops
from coupled_qk.experiments.bench.fast import (
    fastpath_markdown,
    matmul_peak,
    model_step_flops,
    peer_model,
    run_fastpath,
)
from coupled_qk.models.config import GPTConfig
from coupled_qk.training import distributed

CFG = GPTConfig(vocab_size=64, block_size=32, n_layer=1, d_model=32, n_heads=2)


@pytest.mark.slow  # 8 runners (two models, two peers, two modes) and six decoders, ~15 s
def test_fastpath_reports_every_runner_against_standard_in_its_mode(monkeypatch):
    monkeypatch.setattr(distributed, "cpu_supports_bf16", lambda: True)  # emulated where not native: same numbers path
    r = run_fastpath(
        CFG,
        "coupled",
        modes=("eager-fp32", "compiled-bf16"),
        batch_size=2,
        seq_len=16,
        repeats=2,
        warmup=1,
        decode_batch_sizes=(1,),
        prefixes=(8, 40),
        new_tokens=4,
        decode_repeats=2,
        backend="eager",
    )
    assert set(r["train"]) == {
        f"{m} {mode}" for m in ("standard", "coupled", "gpt2", "llama") for mode in ("eager-fp32", "compiled-bf16")
    }
    for k, v in r["train"].items():
        base = r["train"][f"standard {v['mode']}"]
        assert v["ratio"] == pytest.approx(v["median_ms"] / base["median_ms"])
        assert v["speedup"] == pytest.approx(r["train"]["standard eager-fp32"]["median_ms"] / v["median_ms"])
        assert len(v["times_ms"]) == 2 and v["compiled"] == v["mode"].startswith("compiled"), k
        assert v["achieved_flops"] == pytest.approx(v["step_flops"] / (v["median_ms"] / 1000))
        assert v["mfu"] == pytest.approx(v["achieved_flops"] / r["peaks"][v["mode"].split("-")[1]])
    assert r["train"]["gpt2 eager-fp32"]["peer"] and not r["train"]["coupled eager-fp32"]["peer"]
    assert r["settings"]["recompiles_during_timing"] == 0  # everything compiled during the untimed warmup
    assert [(c["batch"], c["prefix"]) for c in r["decode"]] == [(1, 8)]  # 40 + 4 > block_size: skipped
    runs = r["decode"][0]["runs"]
    assert set(runs) == {
        "standard eager",
        "coupled eager",
        "gpt2 eager",
        "llama eager",
        "standard compiled",
        "coupled compiled",
    }
    assert runs["standard compiled"]["ratio"] == 1.0
    text = fastpath_markdown(r)
    assert "| llama (peer) | compiled-bf16 |" in text and "| 1 | 8 | coupled | compiled |" in text


@pytest.mark.parametrize("native", [True, False])
def test_default_modes_are_those_the_cpu_computes_natively(monkeypatch, native):
    """Without native bf16 the default drops the bf16 modes and says so; asking for one is refused by name."""
    monkeypatch.setattr(distributed, "cpu_supports_bf16", lambda: native)
    said = []
    r = run_fastpath(
        CFG,
        ["standard"],
        peers=[],
        batch_size=1,
        seq_len=4,
        repeats=1,
        warmup=1,
        decode=False,
        log=said.append,
        backend="eager",
    )
    expected = list(fast.MODES) if native else [m for m in fast.MODES if m.endswith("fp32")]
    assert r["settings"]["modes"] == expected and r["machine"]["cpu_bf16"] is native
    assert any("no native bf16" in line for line in said) is not native
    if not native:
        with pytest.raises(ValueError, match=r"include bf16, which this cpu does not compute natively"):
            run_fastpath(CFG, ["standard"], modes=["eager-bf16"], peers=[], batch_size=1, seq_len=4, decode=False)


def test_peers_have_the_same_dimensions():
    gpt2, llama = peer_model("gpt2", CFG), peer_model("llama", CFG)
    d, f, v, n = CFG.d_model, CFG.d_ff, CFG.vocab_size, CFG.n_layer
    blocks = n * (4 * d * d + 2 * d * f)
    assert (
        sum(p.numel() for p in gpt2.parameters())
        == v * d + CFG.block_size * d + blocks + n * (3 * d + d + f + d + 4 * d) + 2 * d
    )  # GPT-2 has biases and LayerNorm biases
    assert sum(p.numel() for p in llama.parameters()) == v * d + n * (4 * d * d + 3 * d * f + 2 * d) + d
    x = torch.randint(0, v, (2, 5))
    assert gpt2(x).logits.shape == llama(x).logits.shape == (2, 5, v)
    with pytest.raises(ValueError, match="unknown peer 'bert'"):
        peer_model("bert", CFG)


def test_step_flops_of_peers_and_matmul_peak():
    std = train_step_flops(CFG, 2, 16)["step"]
    assert model_step_flops("gpt2", CFG, 2, 16) == std
    assert model_step_flops("llama", CFG, 2, 16) == std + 3 * 32 * 2 * CFG.d_model * CFG.d_ff
    assert model_step_flops("coupled", CFG.replace(attention="coupled"), 2, 16) > std
    assert 1e6 < matmul_peak(64, 64, 64, torch.float32, torch.device("cpu"), repeats=3) < 1e14


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(modes=["fast-fp8"]), r"modes: unknown \['fast-fp8'\]"),
        (dict(peers=["bert"]), r"peers: unknown \['bert'\]"),
        (dict(repeats=0), "must be >= 1"),
        (dict(seq_len=33), r"seq_len=33 must be in \[1, block_size=32\]"),
        # no decoding cell fits: refused before the training steps (it used to
        # measure them, then write an empty decoding table)
        (
            dict(prefixes=(30, 64), new_tokens=4, peers=[]),
            r"no \(batch, prefix\) cell fits block_size=32 with new_tokens=4: "
            r"prefixes \[30, 64\]",
        ),
    ],
)
def test_fastpath_argument_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        run_fastpath(CFG, "coupled", **kwargs)

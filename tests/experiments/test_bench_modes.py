"""``coupled-qk bench --mode decode|memory`` and ``--sweep`` on a micro model, and the FLOP arithmetic by hand."""

import json

import numpy as np
import pytest

from coupled_qk.cli import main
from coupled_qk.experiments.bench.cost_curve import flop_floor, train_step_flops
from coupled_qk.experiments.bench.decode import paired_ratio
from coupled_qk.models.config import GPTConfig

MICRO = [
    "--set",
    "vocab_size=64",
    "--set",
    "block_size=16",
    "--set",
    "n_layer=1",
    "--set",
    "d_model=16",
    "--set",
    "n_heads=2",
]


def test_train_step_flops_by_hand():
    # 1 layer, d_model 16, 2 heads of 8, d_ff 64, vocab 64; B=1, T=3 -> mean keys (3+1)/2 = 2
    std = GPTConfig(vocab_size=64, block_size=16, n_layer=1, d_model=16, n_heads=2)
    per_token = (
        2 * 16 * (2 + 4) * 8
        + 2 * 2 * 8 * 16  # qkv 1536 + out 512
        + 2 * 2 * 2 * 8 * 2  # scores and A v: 128
        + 4 * 16 * 64  # feed-forward 4096
        + 2 * 16 * 64
    )  # output head 2048
    assert per_token == 8320
    assert train_step_flops(std, 1, 3) == dict(forward=3 * 8320, step=9 * 8320, map_forward=0)
    # Euler, 1 step: one force evaluation on 2 heads (4 * 8 * 8 each = 256) + q and k updates (2 * 8 per head)
    euler = std.replace(attention="coupled")
    map_tok = 2 * 256 + 2 * 8 * (2 + 2)
    assert map_tok == 576
    assert train_step_flops(euler, 1, 3)["map_forward"] == 3 * map_tok
    assert flop_floor(euler, 1, 3) == pytest.approx((8320 + 576) / 8320)
    # leapfrog, 2 steps: 3 force evaluations, 2 q updates and 4 k half-kicks per head
    leap = std.replace(attention="coupled", integrator="leapfrog", n_steps=2)
    assert train_step_flops(leap, 1, 3)["map_forward"] == 3 * (3 * 2 * 256 + 2 * 8 * (2 * 2 + 4 * 2))
    # shared keys under GQA (1 kv head): the force and key updates act on 1 head
    gqa = GPTConfig(
        vocab_size=64,
        block_size=16,
        n_layer=1,
        d_model=16,
        n_heads=2,
        n_kv_heads=1,
        attention="coupled",
        qk_map={"keys_per_query_head": False},
    )
    assert train_step_flops(gqa, 1, 3)["map_forward"] == 3 * (256 + 2 * 8 * (2 + 1))


def test_paired_ratio_interval():
    r = paired_ratio([2.0, 4.0, 6.0, 8.0, 10.0], [1.0, 2.0, 3.0, 4.0, 5.0])
    assert r == dict(median=2.0, lo=2.0, hi=2.0)
    r = paired_ratio([1.0, 2.0, 3.0], [1.0, 1.0, 1.0])
    assert r["median"] == 2.0 and 1.0 <= r["lo"] <= 2.0 <= r["hi"] <= 3.0


def test_decode_and_memory_modes(tmp_path):
    out = str(tmp_path)
    assert (
        main(
            [
                "bench",
                *MICRO,
                "--mode",
                "decode",
                "--prefixes",
                "4,14",
                "--decode-batch-sizes",
                "1,2",
                "--new-tokens",
                "3",
                "--repeats",
                "2",
                "--device",
                "cpu",
                "--variants",
                "coupled",
                "--out-dir",
                out,
            ]
        )
        == 0
    )
    res = json.loads((tmp_path / "decode-tiny-cpu.json").read_text())
    assert [(c["batch"], c["prefix"]) for c in res["cells"]] == [(1, 4), (2, 4)]
    assert res["settings"]["skipped"] == [[1, 14], [2, 14]]  # 14 + 3 > block_size 16
    for c in res["cells"]:
        std, cpl = c["variants"]["standard"], c["variants"]["coupled"]
        assert std["ratio"] == dict(median=1.0, lo=1.0, hi=1.0) and len(cpl["times_s"]) == 2
        assert cpl["tokens_per_s"] == pytest.approx(c["batch"] * 3 / np.median(cpl["times_s"]))
    assert "| batch | prefix |" in (tmp_path / "decode-tiny-cpu.md").read_text()

    assert (
        main(
            [
                "bench",
                *MICRO,
                "--set",
                "n_kv_heads=1",
                "--mode",
                "memory",
                "--batch-size",
                "2",
                "--seq-len",
                "8",
                "--cache-len",
                "10",
                "--device",
                "cpu",
                "--variants",
                "coupled,uncoupled_mlp",
                "--out-dir",
                out,
            ]
        )
        == 0
    )
    res = json.loads((tmp_path / "memory-tiny-cpu.json").read_text())["variants"]
    # KV cache: 1 layer x batch 1 x 10 positions x 8 wide x 4 bytes x (k heads + v heads)
    assert res["standard"]["kv_cache_bytes"] == 10 * 8 * 4 * (1 + 1)
    assert res["uncoupled_mlp"]["kv_cache_bytes"] == res["standard"]["kv_cache_bytes"]
    assert res["coupled"]["kv_cache_bytes"] == 10 * 8 * 4 * (2 + 1)  # one evolved key per query head
    for v in res.values():  # the step allocates at least the logits (2 x 8 x 64 float32)
        assert v["train_peak_bytes"] >= 2 * 8 * 64 * 4
        assert v["resident_bytes"] > 0


@pytest.mark.slow
def test_sweep_writes_the_cost_curve(tmp_path):
    assert (
        main(
            [
                "bench",
                *MICRO,
                "--sweep",
                "--sweep-d-model",
                "16,32",
                "--sweep-seq-len",
                "4,8",
                "--sweep-n-steps",
                "1,2",
                "--variants",
                "coupled",
                "--batch-size",
                "2",
                "--repeats",
                "2",
                "--warmup",
                "1",
                "--device",
                "cpu",
                "--out-dir",
                str(tmp_path),
            ]
        )
        == 0
    )
    res = json.loads((tmp_path / "sweep-tiny-cpu.json").read_text())
    assert [(p["axis"], p["value"]) for p in res["points"]] == [
        ("d_model", 16),
        ("d_model", 32),
        ("seq_len", 4),
        ("seq_len", 8),
        ("n_steps", 1),
        ("n_steps", 2),
    ]
    floors = [p["variants"]["coupled"]["floor"] for p in res["points"] if p["axis"] == "n_steps"]
    assert 1.0 < floors[0] < floors[1]
    assert (tmp_path / "sweep-tiny-cpu.png").stat().st_size > 0
    assert "FLOP floor" in (tmp_path / "sweep-tiny-cpu.md").read_text()


def test_mfu_markdown_uses_the_flop_count():
    from coupled_qk.experiments.bench.cost_curve import mfu_markdown

    cfg = GPTConfig(vocab_size=64, block_size=16, n_layer=1, d_model=16, n_heads=2)
    res = dict(
        preset="micro",
        settings=dict(
            config=cfg.to_dict(), variants=["standard"], batch_size=1, seq_len=3, tokens_per_step=3, compile=False
        ),
        variants={"standard": dict(tokens_per_s=1e9)},
    )
    # 3 x 8320 FLOPs per token (test_train_step_flops_by_hand) x 1e9 tokens/s = 24.96 TFLOP/s; of 100 -> 25.0%
    assert "| micro | off | standard | 1,000,000,000 | 25.0 | 25.0% |" in mfu_markdown([res], 100.0)


@pytest.mark.slow
def test_memory_mode_honours_dtype_and_compile(tmp_path, monkeypatch):
    """Issue 28 item 6: ``--mode memory`` runs the measured step under the requested autocast dtype and through
    ``torch.compile`` when asked (a compile failure falls back to eager and is reported)."""
    import torch

    from coupled_qk.experiments.bench import decode as bench_decode

    seen = []
    real_loss = bench_decode.GPT.loss

    def spy_loss(self, idx, targets, ignore_index=-100):
        seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
        return real_loss(self, idx, targets, ignore_index)

    monkeypatch.setattr(bench_decode.GPT, "loss", spy_loss)
    compiled = []

    def fake_compile(fn, **kw):  # a compiler that records what it compiles and fails on its first call
        compiled.append(fn)

        def broken(*a, **k):
            raise RuntimeError("backend exploded\nmore")

        return broken

    monkeypatch.setattr(bench_decode.torch, "compile", fake_compile)
    out = str(tmp_path)
    args = [
        "bench",
        *MICRO,
        "--mode",
        "memory",
        "--batch-size",
        "2",
        "--seq-len",
        "8",
        "--cache-len",
        "4",
        "--device",
        "cpu",
        "--variants",
        "coupled",
        "--out-dir",
        out,
    ]
    assert main(args + ["--dtype", "bf16"]) == 0
    assert seen and set(seen) == {torch.bfloat16}
    res = json.loads((tmp_path / "memory-tiny-cpu-bf16.json").read_text())
    assert res["settings"]["dtype"] == "bf16" and res["settings"]["compile"] is False
    bf16_peak = res["variants"]["standard"]["train_peak_bytes"]
    seen.clear()
    assert main(args + ["--dtype", "fp32"]) == 0
    assert set(seen) == {None}
    res32 = json.loads((tmp_path / "memory-tiny-cpu.json").read_text())
    assert res32["variants"]["standard"]["train_peak_bytes"] != bf16_peak  # bf16 activations are measured
    assert not compiled
    assert main(args + ["--compile"]) == 0
    assert len(compiled) == 2  # standard and coupled
    res = json.loads((tmp_path / "memory-tiny-cpu-compile.json").read_text())
    assert res["settings"]["compile"] is True
    for v in res["variants"].values():
        assert v["compiled"] is False and v["compile_error"] == "RuntimeError: backend exploded"
    assert "compile failed" in (tmp_path / "memory-tiny-cpu-compile.md").read_text()

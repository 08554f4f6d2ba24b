"""``coupled-qk bench`` on a micro model: structure of the JSON/markdown and ratios from medians (no timing limits)."""

import json

import numpy as np
import pytest
import torch

from coupled_qk.cli import main
from coupled_qk.experiments.bench.machine import machine_info, machine_line
from coupled_qk.experiments.bench.train import run_bench, with_baseline
from coupled_qk.models.config import GPTConfig
from coupled_qk.models.registry import default_variants

VARIANTS = default_variants()

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


def _check_result(result, names, repeats, tokens_per_step):
    assert list(result["variants"]) == names
    assert result["settings"]["tokens_per_step"] == tokens_per_step
    for key in ("cpu", "torch", "threads", "device", "cuda"):
        assert key in result["machine"]
    base = result["variants"]["standard"]
    assert base["ratio"] == 1.0 and base["paired_ratio"] == 1.0 and base["cpu_ratio"] == 1.0
    assert base["overhead_percent"] == 0.0
    for v in result["variants"].values():
        assert len(v["times_ms"]) == repeats
        assert v["median_ms"] == pytest.approx(float(np.median(v["times_ms"])), rel=1e-12)
        assert v["p10_ms"] <= v["median_ms"] <= v["p90_ms"]
        assert v["ratio"] == pytest.approx(v["median_ms"] / base["median_ms"], rel=1e-12)
        assert v["tokens_per_s"] == pytest.approx(tokens_per_step / (v["median_ms"] / 1000.0), rel=1e-12)
        assert v["params"] > 0
        assert v["cpu_ratio"] == pytest.approx(v["cpu_median_ms"] / base["cpu_median_ms"], rel=1e-12)


def test_cli_writes_json_and_markdown(tmp_path, capsys):
    rc = main(
        [
            "bench",
            *MICRO,
            "--batch-size",
            "2",
            "--seq-len",
            "8",
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
    assert rc == 0
    result = json.loads((tmp_path / "bench-tiny-cpu.json").read_text())
    names = list(VARIANTS)
    _check_result(result, names, repeats=2, tokens_per_step=16)
    assert result["settings"]["dtype"] == "fp32" and result["settings"]["compile"] is False
    assert result["variants"]["coupled_leapfrog"]["integrator"] == "leapfrog"
    assert result["variants"]["coupled"]["overhead_percent"] > 0
    assert result["reproduce"].startswith("coupled-qk bench --preset tiny")
    md = (tmp_path / "bench-tiny-cpu.md").read_text()
    assert "| variant |" in md and "tokens/s" in md and result["machine"]["cpu"] in md
    assert result["command"] in md
    for name in names:
        assert f"| {name} |" in md
        assert f"{result['variants'][name]['ratio']:.3f}x" in md
    assert "wrote" in capsys.readouterr().out


def test_variant_subset_always_has_standard_baseline():
    assert with_baseline("coupled,differential") == ["standard", "coupled", "differential"]
    assert with_baseline("all") == list(VARIANTS)
    with pytest.raises(ValueError, match="unknown variant"):
        with_baseline("coupled,nope")
    config = GPTConfig(vocab_size=32, block_size=8, n_layer=1, d_model=16, n_heads=2)
    result = run_bench(config, "coupled_leapfrog", batch_size=1, repeats=2, warmup=1, device="cpu")
    _check_result(result, ["standard", "coupled_leapfrog"], repeats=2, tokens_per_step=8)


def test_compile_failure_falls_back_to_eager(monkeypatch):
    def broken_compile(fn, *args, **kwargs):
        def call(*a, **k):
            raise RuntimeError("no compiler here\nsecond line")

        return call

    monkeypatch.setattr(torch, "compile", broken_compile)
    config = GPTConfig(vocab_size=32, block_size=8, n_layer=1, d_model=16, n_heads=2)
    with pytest.warns(RuntimeWarning, match=r"torch.compile failed \(RuntimeError: no compiler here\)"):
        result = run_bench(config, "coupled", batch_size=1, repeats=2, warmup=1, device="cpu", compile_model=True)
    for v in result["variants"].values():
        assert v["compiled"] is False and v["compile_s"] is None
        assert v["compile_error"] == "RuntimeError: no compiler here"
        assert len(v["times_ms"]) == 2


def test_bench_rejects_attention_option(tmp_path):
    assert main(["bench", "--attention", "coupled", "--out-dir", str(tmp_path)]) == 2
    assert main(["bench", *MICRO, "--seq-len", "32", "--out-dir", str(tmp_path)]) == 2


def test_machine_records_the_timing_environment(monkeypatch):
    """Allocator and thread settings that change CPU timings are written with the results (and only those)."""
    monkeypatch.setenv("MALLOC_TOP_PAD_", "1073741824")
    monkeypatch.setenv("UNRELATED_VARIABLE", "x")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    m = machine_info(torch.device("cpu"))
    assert m["env"]["MALLOC_TOP_PAD_"] == "1073741824"
    assert "UNRELATED_VARIABLE" not in m["env"] and "LD_PRELOAD" not in m["env"]
    line = machine_line(m)
    assert "MALLOC_TOP_PAD_=1073741824" in line and f"{m['threads']} threads" in line
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1\nx")  # every variable the allocator respects
    monkeypatch.setenv("MALLOC_ARENA_TEST", "4")
    m = machine_info(torch.device("cpu"))
    assert m["env"]["GLIBC_TUNABLES"] == "glibc.malloc.trim_threshold=1\nx" and m["env"]["MALLOC_ARENA_TEST"] == "4"
    assert len(machine_line(m).splitlines()) == 1  # a newline in a value does not break the markdown line
    from coupled_qk import allocator

    monkeypatch.setattr(allocator, "_state", "glibc defaults (COUPLED_QK_DEFAULT_MALLOC=1)")
    assert "; malloc: glibc defaults (COUPLED_QK_DEFAULT_MALLOC=1);" in machine_line(machine_info(torch.device("cpu")))
    old = {k: v for k, v in m.items() if k not in ("env", "platform", "allocator")}  # written before these fields
    assert machine_line(old).startswith(f"- machine: {m['cpu']} ({m['cpu_count']} logical CPUs)")

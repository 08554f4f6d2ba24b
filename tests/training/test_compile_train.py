"""``train --compile`` (issue 29, issue 28 item 4): regional compilation probed on the first batch, a fallback to
eager that really fires (forward or lazily compiled backward), checkpoints without ``_orig_mod.``, and bf16
autocast on CPU against fp32."""

import functools
import warnings

import pytest
import torch
import torch._dynamo as dynamo
from torch._dynamo.backends.common import aot_autograd

from coupled_qk.models import compiled as compiled_module
from coupled_qk.training import distributed, model_setup
from coupled_qk.training.checkpoint_format import Checkpoint
from coupled_qk.training.loop import train
from coupled_qk.training.run_folder import RunFolder, load_checkpoint_model

MODEL = dict(n_layer=1, d_model=32, n_heads=2, block_size=16, attention="coupled")
FAST = dict(model=MODEL, max_steps=3, eval_interval=100, dtype="fp32")


def losses(run_dir):
    return [r["train/loss"] for r in RunFolder(run_dir).read_metrics() if "train/loss" in r]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    dynamo.reset()
    yield
    dynamo.reset()


def use_backend(monkeypatch, backend):
    monkeypatch.setattr(
        model_setup, "compile_regions", functools.partial(compiled_module.compile_regions, backend=backend)
    )


def _raise(gm, example_inputs):
    raise RuntimeError("no compiler here")


def _fw_ok(gm, example_inputs):
    return gm.forward


@pytest.mark.slow  # three short runs, one compiled (AOT autograd of the training graph)
def test_compiled_training_matches_eager_and_checkpoints_have_plain_names(tiny_cfg, tmp_path, monkeypatch):
    eager = train(tiny_cfg(out_dir=str(tmp_path / "eager"), **FAST))
    use_backend(monkeypatch, "aot_eager")
    compiled = train(tiny_cfg(out_dir=str(tmp_path / "compiled"), compile=True, **FAST))
    assert compiled["compile"]["compiled"] is True and compiled["compile"]["error"] is None
    assert compiled["compile"]["compile_s"] > 0 and eager["compile"] is None
    a, b = losses(tmp_path / "eager"), losses(tmp_path / "compiled")
    assert len(a) == len(b) == 3
    assert b == pytest.approx(a, rel=1e-4)  # the probe changed neither the weights nor the random state
    model, state = load_checkpoint_model(tmp_path / "compiled")
    assert not any("_orig_mod" in k for k in model.state_dict()) and state["step"] == 3
    from safetensors import safe_open

    with safe_open(str(RunFolder(tmp_path / "compiled").latest_checkpoint() / "model.safetensors"), "pt") as f:
        assert not any("_orig_mod" in k for k in f.keys())
    # an eager run resumes compiled (and the reverse is the same file): the checkpoint does not care
    res = train(
        tiny_cfg(
            out_dir=str(tmp_path / "eager"),
            compile=True,
            resume=True,
            on_budget_change="keep",
            **{**FAST, "max_steps": 5},
        )
    )
    assert res["steps"] == 5 and res["compile"]["compiled"] is True


@pytest.mark.slow  # three short runs
def test_a_compile_failure_trains_eagerly_with_one_warning(tiny_cfg, tmp_path, monkeypatch):
    eager = train(tiny_cfg(out_dir=str(tmp_path / "eager"), **FAST))
    # the backward's compiler runs lazily, at the first backward(): only the loop's probe can catch it
    for where, backend in (("forward", _raise), ("backward", aot_autograd(fw_compiler=_fw_ok, bw_compiler=_raise))):
        dynamo.reset()
        use_backend(monkeypatch, backend)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = train(tiny_cfg(out_dir=str(tmp_path / where), compile=True, **FAST))
        failed = [w for w in caught if "torch.compile failed" in str(w.message)]
        assert len(failed) == 1 and "no compiler here" in str(failed[0].message), where
        assert "eager" in str(failed[0].message)
        assert res["compile"]["compiled"] is False and "no compiler here" in res["compile"]["error"]
        assert losses(tmp_path / where) == losses(tmp_path / "eager")  # bit-identical: the eager path, same data
        assert res["final"] == eager["final"]


@pytest.mark.slow
def test_inductor_compiled_training_runs(tiny_cfg, tmp_path):
    eager = train(tiny_cfg(out_dir=str(tmp_path / "eager"), model=MODEL, max_steps=2, dtype="fp32"))
    res = train(tiny_cfg(out_dir=str(tmp_path / "c"), model=MODEL, max_steps=2, compile=True, dtype="fp32"))
    assert res["compile"]["compiled"] is True, res["compile"]
    assert losses(tmp_path / "c") == pytest.approx(losses(tmp_path / "eager"), rel=1e-3)
    assert res["final"]["test/loss"] == pytest.approx(eager["final"]["test/loss"], rel=1e-3)


def test_auto_dtype_is_bf16_on_cpu_only_when_compiled_and_supported(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(distributed, "cpu_supports_bf16", lambda: True)
    assert distributed.pick_autocast_dtype("auto", cpu, compiled=True) == torch.bfloat16
    assert distributed.pick_autocast_dtype("auto", cpu, compiled=False) is None
    assert distributed.pick_autocast_dtype("fp32", cpu, compiled=True) is None  # the opt-out
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # native bf16: no warning
        assert distributed.pick_autocast_dtype("bf16", cpu) == torch.bfloat16
    monkeypatch.setattr(distributed, "cpu_supports_bf16", lambda: False)
    assert distributed.pick_autocast_dtype("auto", cpu, compiled=True) is None
    with pytest.warns(RuntimeWarning, match="without native bf16.*emulated"):  # as asked, but said
        assert distributed.pick_autocast_dtype("bf16", cpu) == torch.bfloat16


def test_cpu_bf16_detection_reads_the_cpu_flags(monkeypatch, tmp_path):
    import builtins

    real_open = builtins.open
    for flags, expected in (("fpu sse avx512f avx512_bf16", True), ("fpu sse amx_bf16", True), ("fpu sse avx2", False)):
        info = tmp_path / "cpuinfo"
        info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
        monkeypatch.setattr(
            builtins, "open", lambda p, *a, _i=info, **k: real_open(_i if p == "/proc/cpuinfo" else p, *a, **k)
        )
        assert distributed.cpu_supports_bf16() is expected
    monkeypatch.setattr(builtins, "open", lambda *a, **k: (_ for _ in ()).throw(OSError("no /proc")))
    assert distributed.cpu_supports_bf16() is False


@pytest.mark.slow  # two short runs
def test_bf16_autocast_loss_is_within_tolerance_of_fp32(tiny_cfg, tmp_path):
    fp32 = train(tiny_cfg(out_dir=str(tmp_path / "fp32"), model=MODEL, max_steps=6, dtype="fp32"))
    bf16 = train(tiny_cfg(out_dir=str(tmp_path / "bf16"), model=MODEL, max_steps=6, dtype="bf16"))
    a, b = losses(tmp_path / "fp32"), losses(tmp_path / "bf16")
    assert a != b  # bf16 really ran (an exact match would mean autocast did nothing)
    assert b == pytest.approx(a, rel=0.02)  # bf16 has 8 bits of mantissa: ~0.4% per op, 2% on the loss
    assert bf16["final"]["test/loss"] == pytest.approx(fp32["final"]["test/loss"], rel=0.02)
    model, _ = load_checkpoint_model(tmp_path / "bf16")
    assert all(p.dtype == torch.float32 for p in model.parameters())  # fp32 master weights


@pytest.mark.slow  # two short runs, one compiled (aot_eager)
def test_a_resume_keeps_the_precision_the_run_started_in(tiny_cfg, tmp_path, monkeypatch, capsys):
    """A run's precision is fixed at its first start. On a CPU with native bf16, --dtype auto is bf16 compiled and
    fp32 eager: a --compile run that trained in bf16, resumed without --compile, continued in fp32 and recorded
    "fp32" in its results, so a study's reuse check accepted it as an fp32 run. Now the resume continues in bf16 (said
    in one line), records bf16 truthfully (the reuse check of an fp32 plan refuses it), and another --dtype is refused
    before anything is written."""
    from coupled_qk.study.executor import check_same_precision

    monkeypatch.setattr(distributed, "cpu_supports_bf16", lambda: True)
    use_backend(monkeypatch, "aot_eager")
    run = dict(FAST, dtype="auto", out_dir=str(tmp_path / "run"))
    folder = RunFolder(tmp_path / "run")
    train(tiny_cfg(**run, compile=True))
    assert Checkpoint(folder.latest_checkpoint()).state()["precision"] == "bf16"
    capsys.readouterr()
    eager = tiny_cfg(**{**run, "max_steps": 4}, resume=True, on_budget_change="keep")
    res = train(eager)
    assert "precision: continuing in bf16, the run's precision since its first start" in capsys.readouterr().err
    assert res["precision"] == folder.read_results()["precision"] == "bf16"
    assert Checkpoint(folder.latest_checkpoint()).state()["precision"] == "bf16"
    with pytest.raises(ValueError, match=r"finished run trained in bf16 .* but this plan trains in fp32"):
        check_same_precision(folder.read_results(), eager, folder.path)
    before = sorted(p.name for p in folder.path.iterdir())
    with pytest.raises(ValueError, match=r"cannot resume .*different config \(dtype: 'auto' vs 'fp32'\)"):
        train(tiny_cfg(**{**run, "max_steps": 5, "dtype": "fp32"}, resume=True, on_budget_change="keep"))
    assert sorted(p.name for p in folder.path.iterdir()) == before and folder.is_finished()

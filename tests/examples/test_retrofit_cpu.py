"""``examples/retrofit_cpu.py``: the retrofit walk-through runs end to end on a tiny trained run, and the pieces
it takes from the library (schedule, batches, paired statistics) are the ones the script used to re-implement."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs
from scipy import stats

from coupled_qk.training.config import TrainConfig
from coupled_qk.training.loop import train
from coupled_qk.training.tasks.lm import LMTask, batch_offsets
from tests.conftest import write_corpus

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "retrofit_cpu.py"


def load_example():
    spec = importlib.util.spec_from_file_location("retrofit_cpu_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ex = load_example()


def old_schedule(step: int, steps: int, warmup: int) -> float:
    """The formula the script carried before it used the loop's ``lr_at`` (hand-derived reference)."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


@pytest.mark.parametrize("steps, warmup", [(100, 5), (60, 5), (7, 1), (3, 3)])
def test_schedule_is_the_loops_and_matches_the_old_formula(steps, warmup):
    cfg = TrainConfig.from_dict({"corpus": "x", "max_steps": 10})
    got = [ex.schedule_scale(cfg, s, steps, warmup) for s in range(steps)]
    want = [old_schedule(s, steps, warmup) for s in range(steps)]
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=0)
    assert got[warmup - 1] == pytest.approx(1.0) and min(got) >= 0.1 - 1e-12


@settings(max_examples=30, deadline=None)
@given(hs.lists(hs.tuples(hs.floats(1.0, 1e3), hs.floats(1.0, 1e3)), min_size=1, max_size=8))
def test_paired_is_the_library_t_interval(pairs):
    a, b = [p[0] for p in pairs], [p[1] for p in pairs]
    got = ex.paired(a, b)
    d = np.asarray(b, dtype=np.float64) - np.asarray(a, dtype=np.float64)
    n = len(d)
    assert got["n"] == n and got["mean"] == pytest.approx(float(d.mean()), rel=1e-12, abs=1e-9)
    if n < 2:
        assert got["ci95"] is None
        return
    sd = float(np.sqrt(((d - d.mean()) ** 2).sum() / (n - 1)))  # float64 by hand
    half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    assert got["sd"] == pytest.approx(sd, rel=1e-9, abs=1e-9)
    np.testing.assert_allclose(got["ci95"], [d.mean() - half, d.mean() + half], rtol=1e-9, atol=1e-9)


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """A tiny ``standard`` model with learned positions trained by the library's loop (exportable to GPT-2),
    trained once for this module (the ``tiny_corpus`` text of ``tests/conftest.py``)."""
    root = tmp_path_factory.mktemp("retrofit")
    write_corpus(root / "corpus")
    cfg = TrainConfig.from_dict(
        dict(
            corpus=str(root / "corpus"),
            tokenizer="bpe-300",
            cache_dir=str(root / "cache"),
            model=dict(n_layer=1, d_model=32, n_heads=2, block_size=16, position="learned"),
            batch_size=4,
            max_steps=4,
            warmup_steps=1,
            log_interval=1,
            eval_interval=4,
            eval_batches=2,
            out_dir=str(root / "base"),
            progress=False,
            tensorboard=False,
            lr=3e-3,
        )
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the tiny splits' "noisy estimate" warnings
        train(cfg)
    return cfg


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:the .* split of")
def test_batches_are_the_tasks_with_the_data_seed(base_run):
    """``task.train_batch`` with ``seed = data_seed + S`` gives the windows the script indexed by hand."""
    seed, data_seed, batch = 2, 1000, 3
    task = LMTask(dataclasses.replace(base_run, seed=data_seed + seed, resume=True), run_dir=base_run.out_dir)
    tokens, bs = task.tokens["train"], task.block_size
    for step in range(3):
        x, y = task.train_batch(step, 0, 0, 1, batch, "cpu")
        offsets = batch_offsets(data_seed + seed, step, 0, len(tokens) - bs, batch)
        chunk = np.asarray(tokens[offsets[:, None] + np.arange(bs + 1)], dtype=np.int64)
        assert torch.equal(x, torch.from_numpy(chunk[:, :-1])) and torch.equal(y, torch.from_numpy(chunk[:, 1:]))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:the .* split of")
def test_example_runs_end_to_end(base_run, tmp_path, capsys):
    out = tmp_path / "retrofit"
    threads = torch.get_num_threads()
    try:
        ex.main(
            [
                "--run",
                base_run.out_dir,
                "--seeds",
                "0",
                "1",
                "--steps",
                "3",
                "--batch-size",
                "4",
                "--warmup",
                "1",
                "--eval-windows",
                "4",
                "--out",
                str(out),
            ]
        )
    finally:
        torch.set_num_threads(threads)  # main() pins one thread, as the experiment ran
    result = json.loads((out / "results.json").read_text())
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "results.json", "rows-seed0.json", "rows-seed1.json"]
    assert result["export_max_abs_logit_diff"] < 1e-4
    assert result["tokens_per_arm"] == 3 * 4 * 16
    # the machine line describes this machine, not the one the committed results ran on
    assert result["machine"].endswith(f"1 thread per process ({os.cpu_count()} CPUs on the machine)")
    rows = result["rows"]
    assert [r["seed"] for r in rows] == [0, 1]
    a = [r["as_is"]["valid_perplexity"] for r in rows]
    b = [r["retrofit"]["valid_perplexity"] for r in rows]
    for r in rows:
        assert r["start_valid_perplexity"] == result["start_valid_perplexity"] > 1
        assert math.isfinite(r["as_is"]["valid_perplexity"]) and r["retrofit"]["dt_abs_max"] > 0  # dt was trained
        assert r["as_is"]["valid_loss"] == pytest.approx(math.log(r["as_is"]["valid_perplexity"]), rel=1e-6)
    d = np.asarray(b) - np.asarray(a)
    half = float(stats.t.ppf(0.975, 1)) * float(np.std(d, ddof=1)) / math.sqrt(2)
    diff = result["ppl_diff_retrofit_minus_as_is"]
    assert diff["n"] == 2 and diff["mean"] == pytest.approx(float(d.mean()), rel=1e-9, abs=1e-12)
    np.testing.assert_allclose(diff["ci95"], [d.mean() - half, d.mean() + half], rtol=1e-9, atol=1e-12)
    readme = (out / "README.md").read_text()
    assert readme == ex.markdown(result) and "python examples/retrofit_cpu.py --run" in readme
    assert f"| 1 | {a[1]:.3f} | {b[1]:.3f} | {b[1] - a[1]:+.3f} |" in readme
    # a seed run again in its own process reproduces its row (same batches, same initialisation)
    again = tmp_path / "again"
    ex.main(
        [
            "--run",
            base_run.out_dir,
            "--seeds",
            "1",
            "--steps",
            "3",
            "--batch-size",
            "4",
            "--warmup",
            "1",
            "--eval-windows",
            "4",
            "--out",
            str(again),
        ]
    )
    torch.set_num_threads(threads)
    row = json.loads((again / "rows-seed1.json").read_text())
    for arm in ("as_is", "retrofit"):
        assert row[arm]["valid_perplexity"] == rows[1][arm]["valid_perplexity"]


def test_every_example_has_a_test():
    """docs/DESIGN.md: each script of ``examples/`` is tested in ``tests/examples/test_<name>.py``."""
    root = EXAMPLE.parent
    untested = [
        p.name for p in sorted(root.glob("*.py")) if not (Path(__file__).parent / f"test_{p.stem}.py").is_file()
    ]
    assert EXAMPLE.is_file() and not untested, f"examples without a test in tests/examples/: {untested}"


def test_check_resume_names_the_option_that_differs(tmp_path):
    # seeds run as separate processes into one --out were combined whatever settings each ran with
    settings = {"lr": 3e-4, "retrofit": {"freeze_base": False, "layers": None}}
    (tmp_path / "rows-seed0.json").write_text(json.dumps({"seed": 0, "settings": settings}))
    (tmp_path / "rows-seed9.json").write_text(json.dumps({"seed": 9}))  # written before rows kept their settings
    ex.check_resume(tmp_path, json.loads(json.dumps(settings)))
    other = {**settings, "retrofit": {"freeze_base": True, "layers": None}}
    with pytest.raises(
        ValueError,
        match=r"rows-seed0.json was computed with retrofit=\{'freeze_base': False.* but "
        r"this run has retrofit=\{'freeze_base': True",
    ):
        ex.check_resume(tmp_path, other)
    with pytest.raises(ValueError, match=r"computed with lr=0.0003 but this run has lr=0.001"):
        ex.check_resume(tmp_path, {**settings, "lr": 1e-3})


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:the .* split of")
def test_retrofit_options_are_recorded_and_a_different_resume_is_refused(base_run, tmp_path, capsys):
    out = tmp_path / "frozen"
    threads = torch.get_num_threads()
    common = [
        "--run",
        base_run.out_dir,
        "--steps",
        "2",
        "--batch-size",
        "4",
        "--warmup",
        "1",
        "--eval-windows",
        "2",
        "--out",
        str(out),
    ]
    try:
        ex.main([*common, "--seeds", "0", "--freeze-base", "--layers", "0"])
        row = json.loads((out / "rows-seed0.json").read_text())
        assert row["settings"]["retrofit"]["freeze_base"] is True and row["settings"]["retrofit"]["layers"] == [0]
        assert json.loads((out / "results.json").read_text())["settings"]["freeze_base"] is True
        with pytest.raises(SystemExit):
            ex.main([*common, "--seeds", "1"])  # another process, same --out, without --freeze-base
        assert "was computed with freeze_base=True but this run has freeze_base=False" in capsys.readouterr().err
        assert not (out / "rows-seed1.json").exists()
        with pytest.raises(SystemExit):
            ex.main([*common, "--seeds", "1", "--layers", "0", "0"])
        assert "layers=[0, 0]: [0] given more than once" in capsys.readouterr().err
    finally:
        torch.set_num_threads(threads)

"""Fault injection (docs/RELIABILITY.md, "Faults"): a stop signal or a kill at a random step of a tiny run, then
``--resume``, gives the uninterrupted run's losses; a truncated or zeroed checkpoint is refused with a message
naming the file, and the previous good checkpoint is used.

The kill steps are drawn by a seeded generator: ``COUPLED_QK_FAULT_EXAMPLES`` steps per signal (default 1 in
CI; ``COUPLED_QK_FAULT_EXAMPLES=10 pytest tests/reliability/test_fault_injection.py`` for more), and
``COUPLED_QK_FAULT_SEED`` picks other steps. A kill at every point of a checkpoint write is
``tests/training/test_reliability.py::test_3_kill_at_every_point_of_a_resave_leaves_a_loadable_latest``; a SIGKILL
of a real ``coupled-qk train`` inside a checkpoint write, at a drawn save, phase, file and byte, is
:func:`test_a_kill_inside_a_checkpoint_write_resumes_from_the_previous_good_checkpoint` (2 examples in CI,
``COUPLED_QK_HYPOTHESIS_EXAMPLES=N`` for more).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import reliability_profile  # noqa: F401  (the example budget)
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coupled_qk.training.checkpoint_format import Checkpoint
from coupled_qk.training.loop import train
from coupled_qk.training.run_folder import RunFolder, checkpoint_step

EXAMPLES = int(os.environ.get("COUPLED_QK_FAULT_EXAMPLES", "1"))
SEED = int(os.environ.get("COUPLED_QK_FAULT_SEED", "0"))
STEPS = 12


def losses(run_dir) -> list[tuple[int, float]]:
    return [(r["step"], r["train/loss"]) for r in RunFolder(run_dir).read_metrics() if "train/loss" in r]


def final(run_dir) -> dict:
    return json.loads((Path(run_dir) / "results.json").read_text())["final"]


def cli_args(cfg) -> list[str]:
    m = cfg.model
    args = [
        "train",
        "--corpus",
        cfg.corpus,
        "--tokenizer",
        cfg.tokenizer,
        "--cache-dir",
        cfg.cache_dir,
        "--batch-size",
        str(cfg.batch_size),
        "--warmup-steps",
        str(cfg.warmup_steps),
        "--lr",
        str(cfg.lr),
        "--log-interval",
        "1",
        "--eval-interval",
        str(cfg.eval_interval),
        "--eval-batches",
        "2",
        "--max-steps",
        str(cfg.max_steps),
        "--checkpoint-interval",
        str(cfg.checkpoint_interval),
        "--out-dir",
        cfg.out_dir,
        "--no-progress",
        "--no-tensorboard",
    ]
    for key in ("n_layer", "d_model", "n_heads", "block_size"):
        args += ["--set", f"{key}={m[key]}"]
    return args


def _cfg(tiny_cfg, out: Path, **kw):
    return tiny_cfg(max_steps=STEPS, eval_interval=1000, checkpoint_interval=2, out_dir=str(out), **kw)


CASES = [(sig, k) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL) for k in range(EXAMPLES)]


@pytest.mark.slow
@pytest.mark.parametrize("sig,example", CASES, ids=[f"{s.name}-{k}" for s, k in CASES])
def test_a_signal_at_a_random_step_then_resume_gives_the_uninterrupted_run(tiny_cfg, tmp_path, sig, example):
    at = random.Random(f"{SEED}-{sig.name}-{example}").randint(1, STEPS - 2)  # metrics lines seen before the signal
    ref = _cfg(tiny_cfg, tmp_path / "ref")
    train(ref)
    cfg = _cfg(tiny_cfg, tmp_path / "run")
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads()), "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "coupled_qk.cli", *cli_args(cfg)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = Path(cfg.out_dir) / "metrics.jsonl"
    deadline = time.time() + 120
    while (
        time.time() < deadline
        and proc.poll() is None
        and not (metrics.exists() and metrics.read_text().count("\n") >= at)
    ):
        time.sleep(0.005)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    finished = (Path(cfg.out_dir) / "results.json").exists()
    if sig == signal.SIGKILL:
        assert proc.returncode in (-9, 0)
    elif not finished:
        assert proc.returncode == {signal.SIGINT: 130, signal.SIGTERM: 143}[sig], err
        assert "Traceback" not in err and f"stopped by {sig.name}" in err
    if not finished:
        # (killed before the first checkpoint, the folder holds none: --resume starts a new run there)
        train(_cfg(tiny_cfg, tmp_path / "run", resume=True))
    assert losses(cfg.out_dir) == losses(ref.out_dir)
    assert [s for s, _ in losses(cfg.out_dir)] == list(range(1, STEPS + 1))
    assert final(cfg.out_dir)["test/loss"] == final(ref.out_dir)["test/loss"]


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _zero(path: Path) -> None:
    path.write_bytes(b"\0" * path.stat().st_size)


@pytest.mark.slow
@pytest.mark.parametrize(
    "damage,name", [(_truncate, "model.safetensors"), (_zero, "optimizer.pt"), (_zero, "checksums.json")]
)
def test_a_damaged_latest_checkpoint_is_refused_and_the_previous_good_one_used(
    tiny_cfg, tmp_path, capsys, damage, name
):
    steps = 8
    ref = tiny_cfg(max_steps=steps, eval_interval=1000, out_dir=str(tmp_path / "ref"))
    train(ref)
    kw = dict(max_steps=steps, eval_interval=1000, checkpoint_interval=2, out_dir=str(tmp_path / "run"))
    train(tiny_cfg(stop_after_steps=6, **kw))
    latest = RunFolder(kw["out_dir"]).latest_checkpoint()
    assert checkpoint_step(latest) == 6 and (Path(kw["out_dir"]) / "ckpt-00000004").is_dir()
    damage(latest / name)
    capsys.readouterr()
    res = train(tiny_cfg(resume=True, **kw))
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "the latest checkpoint is refused" in line]
    assert len(said) == 1 and name in said[0] and "ckpt-00000004 (step 4)" in said[0], err
    assert res["steps"] == steps
    assert losses(kw["out_dir"]) == losses(ref.out_dir)
    assert res["final"]["test/loss"] == final(ref.out_dir)["test/loss"]
    assert checkpoint_step(RunFolder(kw["out_dir"]).latest_checkpoint()) == steps


def test_no_good_checkpoint_is_one_clear_error(tmp_path):
    from coupled_qk import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=30, block_size=8, n_layer=1, d_model=16, n_heads=2))
    run = tmp_path / "run"
    RunFolder(run).save(model.state_dict(), model.config, None, {"step": 2})
    RunFolder(run).save(model.state_dict(), model.config, None, {"step": 4})
    for folder in run.glob("ckpt-*"):
        _zero(folder / "model.safetensors")
    with pytest.raises(
        ValueError,
        match=r"ckpt-00000004/model\.safetensors is damaged.*no older checkpoint of "
        r".* verifies",
    ):
        RunFolder(run).resume_checkpoint()
    said = []
    _truncate(run / "ckpt-00000004" / "state.json")
    RunFolder(run).save(model.state_dict(), model.config, None, {"step": 1})  # a good older one...
    (run / "latest").write_text("ckpt-00000004\n")  # ...with latest still naming the damaged one
    assert RunFolder(run).resume_checkpoint(said.append).name == "ckpt-00000001"
    assert len(said) == 1 and "ckpt-00000004" in said[0] and "step 1" in said[0]


CHILD = Path(__file__).with_name("checkpoint_fault_child.py")
CHECKPOINT_FILES = ("model.safetensors", "model_config.json", "rng.pt", "state.json", "optimizer.pt")
PHASES = ("file", "checksums", "rename", "latest", "prune")
"""Where inside a save the kill falls (``checkpoint_fault_child.py``): before ``latest`` names the new checkpoint
(the first four) or after (``prune``)."""
KILL_EXAMPLES = int(os.environ.get("COUPLED_QK_HYPOTHESIS_EXAMPLES", "2"))
SAVES = STEPS // 2 - 1  # checkpoint_interval 2: saves at steps 2, 4, ..., the last ones before the end


def _leftovers(run_dir: Path) -> list[str]:
    return sorted(p.name for p in list(run_dir.glob(".ckpt-*")) + list(run_dir.glob(".*.tmp")))


@pytest.mark.slow
def test_a_kill_inside_a_checkpoint_write_resumes_from_the_previous_good_checkpoint(tiny_cfg, tmp_path):
    """SIGKILL a real ``coupled-qk train`` inside save number ``save`` at a drawn phase (a checkpoint file or
    ``checksums.json`` cut at a drawn byte, the complete folder before its rename, ``latest`` half replaced, old
    checkpoints half deleted): the checkpoint ``--resume`` picks is a complete, verified one (the previous save's
    when the kill fell before ``latest`` was replaced), the resumed run's losses and final test loss equal the
    uninterrupted run's, and no partial folder or temporary file is left."""
    ref = _cfg(tiny_cfg, tmp_path / "ref")
    train(ref)
    runs = iter(range(10**6))

    @settings(max_examples=KILL_EXAMPLES)
    @given(
        save=st.integers(1, SAVES),
        phase=st.sampled_from(PHASES),
        file=st.sampled_from(CHECKPOINT_FILES),
        fraction=st.floats(0, 1),
    )
    def kill_and_resume(save, phase, file, fraction):
        cfg = _cfg(tiny_cfg, tmp_path / f"run{next(runs)}")
        run_dir = Path(cfg.out_dir)
        marker = tmp_path / f"paused-{run_dir.name}"
        fault = json.dumps({"save": save, "phase": phase, "file": file, "fraction": fraction})
        env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads()), "PYTHONPATH": os.pathsep.join(sys.path)}
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(marker), fault, "--", *cli_args(cfg)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.time() + 180
        while time.time() < deadline and proc.poll() is None and not marker.exists():
            time.sleep(0.01)
        assert marker.exists(), proc.communicate(timeout=60)[1]
        proc.kill()
        proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL
        before_latest = phase != "prune"
        expected = 2 * (save - 1) if before_latest else 2 * save  # the step --resume continues from
        if expected == 0:
            assert not (run_dir / "latest").exists()
        else:
            where = RunFolder(run_dir).resume_checkpoint()  # verified: never the partial one
            assert checkpoint_step(where) == expected, (where, _leftovers(run_dir))
        train(_cfg(tiny_cfg, run_dir, resume=True))
        assert losses(run_dir) == losses(ref.out_dir)
        assert final(run_dir)["test/loss"] == final(ref.out_dir)["test/loss"]
        assert _leftovers(run_dir) == []
        Checkpoint(RunFolder(run_dir).latest_checkpoint()).verify()

    kill_and_resume()

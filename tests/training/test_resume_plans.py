"""Issue 9 A-D (shared stop decisions, world-size changes, budget extension, fp16 scaler state), 10 (torn
metrics line, checkpoint folder as out_dir) and 11 (file modes follow the umask)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coupled_qk.training import loop
from coupled_qk.training.loop import lr_at, train
from coupled_qk.training.run_folder import RunFolder, load_checkpoint_model

DDP_SCRIPT = r"""
import json, sys
from coupled_qk.training.config import TrainConfig
from coupled_qk.training.loop import train
train(TrainConfig.from_dict(json.loads(sys.argv[1])))
"""


def torchrun(tmp_path, cfg, timeout=240):
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(script),
        json.dumps(cfg.to_dict()),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def records(run_dir, key):
    return [(r["step"], r[key]) for r in RunFolder(run_dir).read_metrics() if key in r]


@pytest.mark.slow
def test_A_time_budget_is_one_decision_for_all_ranks(tiny_cfg, tmp_path):
    # each rank's own clock used to decide: ranks stopped at different steps and the final save hung
    cfg = tiny_cfg(
        batch_size=2, max_steps=100_000, max_minutes=0.03, eval_interval=10**6, out_dir=str(tmp_path / "ddp")
    )
    proc = torchrun(tmp_path, cfg, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "ddp" / "results.json").read_text())
    assert res["stop_reason"] == "max_minutes" and res["world_size"] == 2 and 0 < res["steps"] < 100_000
    assert load_checkpoint_model(tmp_path / "ddp")[1]["step"] == res["steps"]


@pytest.mark.slow
def test_B_resume_on_another_world_size_is_refused_or_replanned_exactly(tiny_cfg, tmp_path, capsys):
    run = str(tmp_path / "ddp")
    proc = torchrun(tmp_path, tiny_cfg(batch_size=2, max_steps=4, stop_after_steps=2, out_dir=run))
    assert proc.returncode == 0, proc.stderr[-3000:]
    with pytest.raises(ValueError, match=r"global batch of 4 sequences.*this run would use 2.*--batch-size 4"):
        train(tiny_cfg(batch_size=2, max_steps=4, out_dir=run, resume=True))
    with pytest.raises(ValueError, match=r"grad_accum: 1 vs 2"):
        train(tiny_cfg(batch_size=4, grad_accum=2, max_steps=4, out_dir=run, resume=True))
    res = train(tiny_cfg(batch_size=4, max_steps=4, out_dir=run, resume=True))
    assert "re-planned for 1 process(es) x batch_size 4 (was 2 x 2)" in capsys.readouterr().err
    assert res["steps"] == 4 and res["tokens"] == 4 * 4 * 16  # exactly the budget, not more
    single = train(tiny_cfg(batch_size=4, max_steps=4, out_dir=str(tmp_path / "single")))
    assert losses_close(losses(run), losses(single["config"]["out_dir"]))


def losses(run_dir):
    return [v for _, v in records(run_dir, "train/loss")]


def losses_close(a, b):
    return len(a) == len(b) and all(abs(x - y) <= 1e-5 * max(1.0, abs(y)) for x, y in zip(a, b))


def test_C_budget_extension_is_deliberate(tiny_cfg, tmp_path):
    kw = dict(lr=0.01, warmup_steps=2, min_lr_ratio=0.1)
    train(tiny_cfg(max_steps=10, **kw))
    with pytest.raises(
        ValueError,
        match=r"different budget.*step 11 to 0\.00\d+ where the saved schedule gives "
        r"0\.001.*--on-budget-change keep",
    ):
        train(tiny_cfg(max_steps=20, resume=True, **kw))
    cfg = tiny_cfg(max_steps=20, resume=True, on_budget_change="keep", **kw)
    train(cfg)
    lrs = dict(records(cfg.out_dir, "lr"))
    assert [lrs[s] for s in range(11, 21)] == [pytest.approx(0.001)] * 10  # the decayed schedule's floor
    assert lrs[10] == pytest.approx(lr_at(9, cfg, 10))
    # re-warm: a new warmup and cosine from step 20 to 30
    cfg = tiny_cfg(max_steps=30, resume=True, on_budget_change="rewarm", **kw)
    train(cfg)
    lrs = dict(records(cfg.out_dir, "lr"))
    assert lrs[21] == pytest.approx(0.005) and lrs[22] == pytest.approx(0.01)
    assert [lrs[s] for s in range(21, 31)] == [pytest.approx(lr_at(s - 1, cfg, 30, start=20)) for s in range(21, 31)]
    assert lrs[30] == pytest.approx(0.001 + 0.5 * (1 + __import__("math").cos(__import__("math").pi * 7 / 8)) * 0.009)
    res = train(tiny_cfg(max_steps=30, resume=True, **kw))  # the same budget again: no change, no flag needed
    assert res["steps"] == 30


def test_D_fp16_loss_scale_is_checkpointed(tiny_cfg, tmp_path, monkeypatch):
    # 2**19 overflows at step 2 of this model and backs off to 2**18; a resume that restarted at 2**19 would
    # skip a step the uninterrupted run takes
    monkeypatch.setattr(loop, "GRAD_SCALE_INIT", 2.0**19)
    full = tiny_cfg(dtype="fp16", out_dir=str(tmp_path / "full"))
    train(full)
    part = str(tmp_path / "part")
    train(tiny_cfg(dtype="fp16", out_dir=part, stop_after_steps=4))
    assert load_checkpoint_model(part)[1]["grad_scaler"]["scale"] == 2.0**18
    train(tiny_cfg(dtype="fp16", out_dir=part, resume=True))
    assert records(part, "loss_scale") == records(full.out_dir, "loss_scale")
    scales = [v for _, v in records(full.out_dir, "loss_scale")]
    assert scales[0] == 2.0**19 and scales[-1] == 2.0**18
    assert losses(part) == losses(full.out_dir)


def test_10_torn_last_metrics_line_is_dropped(tiny_cfg):
    cfg = tiny_cfg(max_steps=4, stop_after_steps=2)
    train(cfg)
    metrics = Path(cfg.out_dir) / "metrics.jsonl"
    with metrics.open("a") as f:
        f.write('{"step": 3, "train/lo')  # what a kill in the middle of a write leaves
    with pytest.warns(UserWarning, match="torn last line"):
        assert [r["step"] for r in RunFolder(cfg.out_dir).read_metrics()] == [1, 2]
    with pytest.warns(UserWarning, match="torn last line"):
        res = train(tiny_cfg(max_steps=4, resume=True))
    assert res["steps"] == 4 and [s for s, _ in records(cfg.out_dir, "train/loss")] == [1, 2, 3, 4]
    text = metrics.read_text().splitlines()
    metrics.write_text("\n".join([text[0], "garbage", *text[1:]]) + "\n")
    with pytest.raises(ValueError, match=r"metrics\.jsonl: line 2 is not valid JSON"):
        RunFolder(cfg.out_dir).read_metrics()


def test_10_checkpoint_folder_as_out_dir_names_the_run(tiny_cfg):
    cfg = tiny_cfg(max_steps=2)
    train(cfg)
    inner = RunFolder(cfg.out_dir).latest_checkpoint()
    before = sorted(p.name for p in inner.iterdir())
    with pytest.raises(ValueError, match=rf"checkpoint folder inside the run {cfg.out_dir}; pass --out-dir"):
        train(tiny_cfg(max_steps=4, out_dir=str(inner), resume=True))
    assert sorted(p.name for p in inner.iterdir()) == before


@pytest.mark.parametrize("umask, dmode, fmode", [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600), (0o002, 0o775, 0o664)])
def test_11_modes_follow_the_umask(tiny_cfg, tmp_path, umask, dmode, fmode):
    old = os.umask(umask)
    try:
        cfg = tiny_cfg(max_steps=2, out_dir=str(tmp_path / f"run{umask:o}"))
        train(cfg)
    finally:
        os.umask(old)
    run = Path(cfg.out_dir)
    where = RunFolder(run).latest_checkpoint()
    assert (where.stat().st_mode & 0o777) == dmode
    for file in [*where.iterdir(), run / "results.json", run / "latest", run / "config.json"]:
        assert (file.stat().st_mode & 0o777) == fmode, file


def test_C_smaller_budget_than_the_steps_done_offers_a_new_out_dir(tiny_cfg):
    """Issue 31.2: an interrupted run at step 6 resumed with a 3-step budget cannot keep or re-warm a schedule
    (both would train backwards): the message offers a new --out-dir, never --on-budget-change."""
    train(tiny_cfg(max_steps=10, stop_after_steps=6))
    for choice in (None, "rewarm", "keep"):
        with pytest.raises(ValueError) as err:
            train(tiny_cfg(max_steps=3, resume=True, on_budget_change=choice))
        message = str(err.value)
        assert "already at step 6, past this budget's end at step 3" in message, choice
        assert "pass another --out-dir" in message and "--on-budget-change" not in message
    assert train(tiny_cfg(max_steps=10, resume=True))["steps"] == 10  # its own budget still finishes it


def test_10_a_damaged_metrics_line_refuses_the_resume_before_anything_is_written(tiny_cfg):
    """A damaged line inside ``metrics.jsonl`` was refused only when the logger opened it, after ``config.json`` had
    been rewritten with the refused resume's settings (here its budget). Now refused first, saying what to do."""
    train(tiny_cfg(max_steps=4, stop_after_steps=2))
    run = Path(tiny_cfg().out_dir)
    text = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join([text[0], "garbage", *text[1:]]) + "\n")
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(ValueError, match=r"metrics\.jsonl: line 2 is not valid JSON .*repair or delete that line"):
        train(tiny_cfg(max_steps=6, on_budget_change="keep", resume=True))
    assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()} == before

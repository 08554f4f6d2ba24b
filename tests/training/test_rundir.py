"""RunDir: the run-folder layout, as written by train() and read by eval, analyze and the experiment runner."""

from __future__ import annotations

import json

import pytest

from coupled_qk.training.rundir import RunDir


def test_layout_matches_what_train_writes(tiny_cfg, tmp_path):
    from coupled_qk.training.loop import train

    res = train(tiny_cfg(max_steps=4, checkpoint_interval=2, tensorboard=True))
    run = RunDir(res["config"]["out_dir"])
    assert run.path == tmp_path / "run" and run / "latest" == run.latest_path
    assert run.is_finished() and run.has_checkpoint() and run.has_tokenizer()
    for path in (run.config_path, run.model_config_path, run.data_path, run.metrics_path, run.results_path):
        assert path.is_file(), path
    assert run.tensorboard_dir.is_dir() and any(run.tensorboard_dir.iterdir())
    assert run.checkpoints() == [run.checkpoint_dir(2), run.checkpoint_dir(4)]
    assert run.checkpoint_dir(4).name == "ckpt-00000004" and run.latest_checkpoint() == run.checkpoint_dir(4)
    assert run.read_config() == res["config"] and run.read_results()["final"] == res["final"]
    assert [r["step"] for r in run.read_metrics() if "train/loss" in r] == [1, 2, 3, 4]
    state = json.loads((run.checkpoint_dir(4) / "state.json").read_text())
    assert run.train_seconds() == state["train_seconds"] > 0


def test_empty_folder_and_torn_metrics(tmp_path):
    run = RunDir(tmp_path / "nothing")
    assert not run.is_finished() and not run.has_checkpoint() and not run.has_tokenizer()
    assert run.read_config() is None and run.read_results() is None and run.read_metrics() == []
    assert run.checkpoints() == [] and run.train_seconds() == 0.0
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        run.latest_checkpoint()
    run.path.mkdir()
    run.metrics_path.write_text('{"step": 1}\n{"step": 2}\n{"st')  # a kill during a write
    with pytest.warns(UserWarning, match="torn last line"):
        assert run.read_metrics() == [{"step": 1}, {"step": 2}]
    run.metrics_path.write_text('{"step": 1}\n{"st\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl: line 2 is not valid JSON"):
        run.read_metrics()
    run.config_path.write_text("{")
    with pytest.raises(ValueError, match=r"config\.json is not valid JSON"):
        run.read_config()


def test_results_interrupted_and_partial_removal(tmp_path):
    run = RunDir(tmp_path / "r")
    run.write_results({"steps": 3, "path": tmp_path})  # non-JSON values are written with str()
    assert run.read_results() == {"steps": 3, "path": str(tmp_path)}
    run.mark_interrupted()
    assert not run.is_finished() and json.loads(run.interrupted_results_path.read_text())["steps"] == 3
    for name in ("config.json", "model_config.json", "data.json", "metrics.jsonl", "notes.txt"):
        (run / name).write_text("{}")
    (run.tokenizer_dir).mkdir()
    (run.checkpoint_dir(7)).mkdir()  # complete but never named in `latest` (a kill between the two)
    run.remove_partial()
    assert sorted(p.name for p in run.path.iterdir()) == ["notes.txt"]  # files outside the layout stay
    run.latest_path.write_text("ckpt-00000007\n")
    with pytest.raises(ValueError, match="holds a checkpoint or results"):
        run.remove_partial()


def test_partial_removal_never_touches_a_run_another_process_is_writing(tmp_path):
    """A run still training before its first checkpoint looks like a killed one; while its writer holds the
    lock, a second process's clean-up is refused and every file stays (a real loss seen with two claims
    processes on one run folder). flock locks per open file, so a second RunLock in this process conflicts too."""
    from coupled_qk.training.lock import RunLock, RunLockedError

    run = RunDir(tmp_path / "r")
    run.path.mkdir()
    for name in ("config.json", "metrics.jsonl"):
        (run / name).write_text("{}")
    run.tokenizer_dir.mkdir()
    with RunLock(run.path):
        with pytest.raises(RunLockedError, match="is in use by pid"):
            run.remove_partial()
        assert run.config_path.is_file() and run.metrics_path.is_file() and run.tokenizer_dir.is_dir()
    run.remove_partial()  # the writer is gone: now it is a killed run, cleaned
    assert not run.config_path.exists() and not run.tokenizer_dir.exists() and not (run / ".lock").exists()

"""Issue 9, data loss (1-5), distributed and resumed runs (A-D), torn metrics (10) and file modes (11).

Each test injects the fault the issue describes and checks the value a correct run gives: a refused second
writer naming the holder, a checkpoint of the interrupted step that resumes bit-exactly, a loadable ``latest``
after a kill at every point of a re-save, a diverged run that saved nothing after the last good step, ...
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from coupled_qk.training import run_folder
from coupled_qk.training.checkpoint_format import Checkpoint
from coupled_qk.training.lock import RunLockedError
from coupled_qk.training.loop import TrainingDiverged, train
from coupled_qk.training.run_folder import RunFolder, checkpoint_step, load_checkpoint_model


def losses(run_dir):
    return [r["train/loss"] for r in RunFolder(run_dir).read_metrics() if "train/loss" in r]


def cli_args(cfg) -> list[str]:
    """``coupled-qk train`` arguments equivalent to a tiny TrainConfig."""
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
        "--out-dir",
        cfg.out_dir,
        "--no-progress",
        "--no-tensorboard",
    ]
    for key in ("n_layer", "d_model", "n_heads", "block_size"):
        args += ["--set", f"{key}={m[key]}"]
    return args


# 1. one writer per run folder -------------------------------------------------------------------------------


def test_1_lock_refuses_second_writer_naming_holder(tiny_cfg, tmp_path, capsys):
    cfg = tiny_cfg(max_steps=2)
    with RunFolder(cfg.out_dir).lock():
        with pytest.raises(RunLockedError, match=rf"in use by pid {os.getpid()} on "):
            train(cfg)
        from coupled_qk.cli import main

        assert main(cli_args(cfg)) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"pid {os.getpid()}" in err[0]
    assert not (Path(cfg.out_dir) / ".lock").exists()
    assert train(cfg)["steps"] == 2  # released: the run proceeds, and leaves no lock file
    assert not (Path(cfg.out_dir) / ".lock").exists()


@pytest.mark.slow
def test_1_stale_lock_of_a_killed_process_is_taken_over(tmp_path):
    run = tmp_path / "run"
    code = (
        "from coupled_qk.training.run_folder import RunFolder; import os; "
        f"RunFolder({str(run)!r}).lock().acquire(); os._exit(9)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 9
    assert (run / ".lock").exists()  # left behind by the dead holder, but its flock died with it
    with RunFolder(run).lock() as lock:
        assert lock.held
        assert json.loads((run / ".lock").read_text())["pid"] == os.getpid()


# 2. stop signals save the current step; periodic checkpoints by default ---------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_2_signal_saves_a_checkpoint_that_resumes_exactly(tiny_cfg, tmp_path, sig, code):
    ref = tiny_cfg(max_steps=40, eval_interval=1000, out_dir=str(tmp_path / "ref"))
    train(ref)
    cfg = tiny_cfg(max_steps=40, eval_interval=1000, out_dir=str(tmp_path / "sig"))
    # the same thread count as this process (bit-identity across a resume needs the same reduction order)
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
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 3):
        time.sleep(0.01)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("coupled-qk: warning:")]
    assert len(lines) == 1 and f"stopped by {sig.name} at step" in lines[0] and "--resume" in lines[0], err
    stopped = int(lines[0].split("at step ")[1].split(";")[0])
    assert 3 <= stopped < 40
    assert load_checkpoint_model(cfg.out_dir)[1]["step"] == stopped
    res = train(tiny_cfg(max_steps=40, eval_interval=1000, out_dir=cfg.out_dir, resume=True))
    assert res["steps"] == 40
    assert losses(cfg.out_dir) == losses(ref.out_dir)  # bit-identical to the uninterrupted run
    assert (
        res["final"]["test/perplexity"]
        == json.loads((Path(ref.out_dir) / "results.json").read_text())["final"]["test/perplexity"]
    )


def test_2_signal_during_the_last_steps_evaluation_stops_the_process(tiny_cfg, monkeypatch):
    """A signal after the last step's stop decision (here: during its evaluation) used to be swallowed, so a
    command training several runs went on to the next one. Now the run completes and the stop propagates."""
    from coupled_qk.training.stop import TrainingInterrupted
    from coupled_qk.training.tasks.lm import LMTask

    cfg = tiny_cfg(max_steps=4, eval_interval=1000)
    evaluate = LMTask.evaluate

    def evaluate_then_signal(self, *args, quick=True, **kw):
        if quick:  # the in-loop evaluation of the last step (eval_interval is larger than the run)
            os.kill(os.getpid(), signal.SIGTERM)
        return evaluate(self, *args, quick=quick, **kw)

    monkeypatch.setattr(LMTask, "evaluate", evaluate_then_signal)
    with pytest.raises(TrainingInterrupted, match="after the last step") as info:
        train(cfg)
    assert info.value.finished and info.value.exit_code == 143
    results = json.loads((Path(cfg.out_dir) / "results.json").read_text())
    assert results["steps"] == 4 and results["stop_reason"] == "completed"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the handler was restored


def test_2_periodic_checkpoints_by_default(tiny_cfg, tmp_path):
    from coupled_qk.training.config import TrainConfig

    assert TrainConfig(max_steps=1).checkpoint_minutes == 15.0  # documented default
    cfg = tiny_cfg(max_steps=6, checkpoint_minutes=1e-9, keep_checkpoints=10)  # due after every step
    train(cfg)
    steps = sorted(checkpoint_step(p) for p in Path(cfg.out_dir).glob("ckpt-*"))
    assert steps == [1, 2, 3, 4, 5, 6]


# 3. a re-save is atomic: latest always names a complete checkpoint ------------------------------------------


def _fork_and_kill_at(run: Path, kill_at: int, model) -> int:
    pid = os.fork()
    if pid == 0:  # child: re-save step 6 and die just before the kill_at-th rename or delete
        calls = {"n": 0}

        def dying(real):
            def wrapper(*a, **k):
                calls["n"] += 1
                if calls["n"] == kill_at:
                    os._exit(9)
                return real(*a, **k)

            return wrapper

        os.replace = dying(os.replace)
        run_folder.shutil.rmtree = dying(run_folder.shutil.rmtree)
        RunFolder(run).save(model.state_dict(), model.config, {"o": 1}, {"step": 6})
        os._exit(0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_3_kill_at_every_point_of_a_resave_leaves_a_loadable_latest(tmp_path):
    from coupled_qk import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=30, block_size=8, n_layer=1, d_model=16, n_heads=2))
    run = tmp_path / "run"
    RunFolder(run).save(model.state_dict(), model.config, {"o": 1}, {"step": 6})
    killed = 0
    for kill_at in range(1, 12):
        code = _fork_and_kill_at(run, kill_at, model)
        killed += code == 9
        loaded, state = load_checkpoint_model(run)  # verifies the checksums too
        assert state["step"] == 6
        torch.testing.assert_close(loaded.tok_emb.weight, model.tok_emb.weight)
        if code == 0:
            break
    assert killed >= 3  # the tmp -> final rename, the latest replace and the old folder's delete
    RunFolder(run).save(model.state_dict(), model.config, None, {"step": 6})
    names = sorted(p.name for p in run.iterdir())
    assert len([n for n in names if n.startswith("ckpt-")]) == 1 and not [n for n in names if n.startswith(".")]


def test_3_resume_of_a_finished_run_keeps_latest_valid(tiny_cfg):
    cfg = tiny_cfg(max_steps=4, checkpoint_interval=2, stop_after_steps=4)
    train(cfg)
    train(tiny_cfg(max_steps=4, resume=True))
    assert load_checkpoint_model(cfg.out_dir)[1]["step"] == 4


# 4. a non-finite run stops, saves nothing after the last good step, and exits non-zero ------------------------


def test_4_non_finite_run_stops_and_keeps_last_good_checkpoint(tiny_cfg, capsys):
    cfg = tiny_cfg(lr=1000.0, max_steps=30, checkpoint_interval=1, keep_checkpoints=30)
    with pytest.raises(TrainingDiverged, match=r"non-finite at step (\d+).*last good checkpoint is .*ckpt-") as info:
        train(cfg)
    bad_step = int(info.value.args[0].split("at step ")[1].split(" ")[0])
    model, state = load_checkpoint_model(cfg.out_dir)
    assert state["step"] == bad_step - 1
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert not (Path(cfg.out_dir) / "results.json").exists()
    assert all(map(lambda x: x == x and abs(x) != float("inf"), losses(cfg.out_dir)))
    from coupled_qk.cli import main

    args = cli_args(tiny_cfg(lr=1000.0, max_steps=30, out_dir=cfg.out_dir + "-cli"))
    assert main(args) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "non-finite at step" in err[0]


def test_4_non_finite_weights_are_refused_on_load(tmp_path):
    from coupled_qk import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=30, block_size=8, n_layer=1, d_model=16, n_heads=2))
    with torch.no_grad():
        model.tok_emb.weight[0, 0] = float("nan")
    RunFolder(tmp_path).save(model.state_dict(), model.config, None, {"step": 1})
    with pytest.raises(ValueError, match=r"non-finite .*tok_emb\.weight"):
        load_checkpoint_model(tmp_path)


# 5. damaged tensor bytes with an intact header are detected ---------------------------------------------------


def test_5_flipped_tensor_bytes_are_detected(tiny_cfg, capsys):
    from safetensors.torch import load_file

    from coupled_qk.cli import main

    cfg = tiny_cfg(max_steps=2)
    train(cfg)
    where = RunFolder(cfg.out_dir).latest_checkpoint()
    file = where / "model.safetensors"
    data = bytearray(file.read_bytes())
    header = 8 + int.from_bytes(data[:8], "little")
    data[header + 16 : header + 80] = b"\xff" * 64  # tensor data overwritten, header intact
    file.write_bytes(bytes(data))
    assert load_file(str(file))  # the format itself does not notice
    with pytest.raises(ValueError, match=r"model\.safetensors is damaged: its SHA-256 differs"):
        load_checkpoint_model(cfg.out_dir)
    capsys.readouterr()
    assert main(["eval", cfg.out_dir]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "SHA-256" in err[0]
    assert main(cli_args(tiny_cfg(max_steps=4)) + ["--resume"]) == 2  # resume verifies every file
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "SHA-256" in err[0]
    opt = where / "optimizer.pt"
    opt.write_bytes(opt.read_bytes()[:-10])  # truncated
    with pytest.raises(ValueError, match=r"optimizer\.pt is damaged"):
        Checkpoint(where).verify(("optimizer.pt",))
    (where / "checksums.json").unlink()  # an older checkpoint: the reader's error, still one line
    with pytest.raises(ValueError, match=r"cannot read .*optimizer\.pt"):
        Checkpoint(where).optimizer_state()


@pytest.mark.parametrize(
    "file, text, message",
    [
        ("state.json", "[]", r"state\.json holds a JSON list, expected an object"),
        ("state.json", "{}", r"state\.json has step=None, expected an integer >= 0"),
        ("state.json", '{"step": "7"}', r"state\.json has step='7', expected an integer >= 0"),
        ("state.json", '{"step": true}', r"state\.json has step=True, expected an integer >= 0"),
        ("checksums.json", "[1]", r"checksums\.json holds a JSON list, expected an object"),
        ("checksums.json", '{"state.json": 5}', r"checksums\.json holds values other than SHA-256 texts"),
    ],
)
def test_4_a_checkpoint_json_file_of_another_kind_is_named_by_every_reader(tmp_path, file, text, message):
    """A ``state.json`` or ``checksums.json`` that parses but is not the object a checkpoint holds (hand-edited,
    or damaged in a checkpoint written before checksums were recorded) was a traceback from every reader
    (``'list' object has no attribute 'get'``, ``KeyError: 'step'``); and ``{}`` was loaded as "step None".
    Now a ``ValueError`` naming the file; ``--resume`` takes the previous good checkpoint instead."""
    from coupled_qk import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=30, block_size=8, n_layer=1, d_model=16, n_heads=2))
    good = RunFolder(tmp_path).save(model.state_dict(), model.config, None, {"step": 1, "train_seconds": 3.0})
    bad = RunFolder(tmp_path).save(model.state_dict(), model.config, None, {"step": 2, "train_seconds": 4.0})
    if file == "state.json":
        (bad / "checksums.json").unlink()  # an older checkpoint: nothing to compare the edited file with
    (bad / file).write_text(text)
    with pytest.raises(ValueError, match=message):
        load_checkpoint_model(tmp_path)
    said = []
    assert RunFolder(tmp_path).resume_checkpoint(said.append) == good
    assert len(said) == 1 and re.search(message, said[0]), said
    assert RunFolder(tmp_path).train_seconds() == (0.0 if file == "state.json" else 4.0)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"\xff\xfe\x00ckpt", "is not UTF-8 text"),
        (b"", "names '', not a folder of the run"),
        (b"\n", "names '', not a folder of the run"),
        (b"../other/ckpt-00000001\n", "names '../other/ckpt-00000001', not a folder of the run"),
        (b"..", "names '..', not a folder of the run"),
    ],
)
@pytest.mark.parametrize("pointer", ["latest", "best"])
def test_4_a_damaged_latest_or_best_pointer_is_named(tmp_path, content, message, pointer):
    """``latest`` not UTF-8 was "'utf-8' codec can't decode byte 0xff" naming no file (from eval, export, generate
    and --resume); empty, it named the run folder itself; ``../other/ckpt-*`` loaded another run's weights. Now
    one ``ValueError`` naming the file and what to write into it; ``--resume`` takes the newest good checkpoint."""
    from coupled_qk import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=30, block_size=8, n_layer=1, d_model=16, n_heads=2))
    other = RunFolder(tmp_path / "other").save(model.state_dict(), model.config, None, {"step": 1})
    run = tmp_path / "run"
    good = RunFolder(run).save(model.state_dict(), model.config, None, {"step": 2})
    RunFolder(run).save_best(model.state_dict(), model.config, {"step": 2})
    assert other.is_dir() and RunFolder(run).best_checkpoint().name == "best-00000002"
    (run / pointer).write_bytes(content)
    load = RunFolder(run).best_checkpoint if pointer == "best" else lambda: load_checkpoint_model(run)
    with pytest.raises(ValueError, match=re.escape(f"{run / pointer} {message}") + ".*ckpt-00000002"):
        load()
    if pointer == "latest":
        said = []
        assert RunFolder(run).resume_checkpoint(said.append) == good
        assert len(said) == 1 and message in said[0], said

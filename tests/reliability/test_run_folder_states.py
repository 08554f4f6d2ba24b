"""What the run folder knows, every command asks (issue 46, kinds 7, 3 and 10 for run folders).

- Kind 7: every reader of a run folder (``eval``, ``analyze``, ``generate``/``load_run``, ``export``,
  ``load_checkpoint_model``, ``glue``'s pretrained run, the experiment runner's reuse) asks the run folder for its
  state once (``run_folder.open_run``, ``RunFolder.holder``): generated over readers x broken states.
- Kind 3: a run's own files are never replaced by a command, ``--overwrite`` or not (``run_folder.run_file_owner``):
  generated over every file of a run.
- Kind 10: a resume continues in the run's precision (``RunFolder.resume_precision``); ``generate`` refuses a
  right-padded prompt mask instead of predicting from its padding.

The run is the committed fixture written by the previous layout's code (``tests/training/fixtures``): reading it
costs no training.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from coupled_qk.training.config import TrainConfig
from coupled_qk.training.lock import RunLockedError
from coupled_qk.training.run_folder import RunFolder, load_checkpoint_model, run_file_owner

FIXTURE = Path(__file__).resolve().parents[1] / "training" / "fixtures" / "previous_layout"


@pytest.fixture
def run(tmp_path, monkeypatch) -> RunFolder:
    """A copy of the fixture's finished-at-step-4 language-model run (the cwd: its config names ``corpus``)."""
    shutil.copytree(FIXTURE, tmp_path / "old")
    monkeypatch.chdir(tmp_path / "old")
    return RunFolder(Path("run").absolute())


@contextlib.contextmanager
def held_elsewhere(folder: RunFolder):
    """The run's lock held as another process holds it: an ``flock`` on another open file of ``.lock`` (a
    :class:`RunLock` of this process would count as the reader's own), naming its holder."""
    fd = os.open(folder.lock_path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps({"pid": 4242, "host": "node7", "started": 0, "command": "coupled-qk train"}).encode())
        yield
    finally:
        os.close(fd)
        folder.lock_path.unlink(missing_ok=True)


def _reuse(folder: RunFolder, tmp: Path):
    """The experiment runner's reader (compare, mqar, glue): reuse or continue the run as its plan says."""
    from coupled_qk.study.executor import PlannedRun, execute

    cfg = TrainConfig.from_dict({**folder.read_config(), "out_dir": str(folder.path), "device": "cpu"})
    return execute([PlannedRun(cfg, "run")], train_fn=lambda c: {"stop_reason": "completed"}, log=lambda s: None)


def _glue(folder: RunFolder, tmp: Path):
    from coupled_qk.training.tasks.glue import resolve_pretrained

    return resolve_pretrained(folder.path)


def _eval(folder: RunFolder, tmp: Path):
    from coupled_qk.training.evaluate import evaluate_checkpoint

    return evaluate_checkpoint(folder.path, splits=("valid",), device="cpu")


def _analyze(folder: RunFolder, tmp: Path):
    from coupled_qk.analysis.analyze import analyze_checkpoints

    return analyze_checkpoints([folder.path], n_sequences=1, seq_len=4, out_dir=tmp / "analysis", make_plots=False)


def _load_run(folder: RunFolder, tmp: Path):
    from coupled_qk.training.pretrained import load_run

    return load_run(folder.path)


def _export(folder: RunFolder, tmp: Path):
    pytest.importorskip("transformers")
    from coupled_qk.hf.export import export_run

    return export_run(folder.path, tmp / "hf")


READERS = {  # reader: (call, the states it needs, the states it warns about)
    "eval": (_eval, {"live", "no data.json", "no tokenizer"}, set()),
    "analyze": (_analyze, {"live", "no tokenizer"}, {"no data.json"}),
    "generate (load_run)": (_load_run, {"live", "no tokenizer"}, set()),
    "export": (_export, {"live", "no tokenizer"}, set()),
    "load_checkpoint_model": (lambda f, t: load_checkpoint_model(f.path), {"live", "no tokenizer"}, set()),
    "glue (pretrained run)": (_glue, {"live", "no tokenizer"}, set()),
    "reuse (compare, mqar, glue)": (_reuse, {"live"}, set()),
}
"""Every reader of a run folder; a state in its needs is refused, one it warns about is said."""

STATES = {  # state: (breaks the run, what the reader's error or warning says)
    "intact": (lambda f: contextlib.nullcontext(), None),
    "live": (held_elsewhere, r"(still training \(|being written by )pid 4242 on node7"),
    "no data.json": (lambda f: contextlib.nullcontext(f.data_path.unlink()), r"data\.json is missing"),
    "no tokenizer": (lambda f: contextlib.nullcontext(shutil.rmtree(f.tokenizer_dir)), r"tokenizer is missing"),
}


def _snapshot(folder: RunFolder) -> dict:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.path.rglob("*") if p.is_file()}


@pytest.mark.parametrize("state", sorted(STATES))
@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_asks_the_run_folder_for_its_state(run, tmp_path, reader, state):
    """A reader refuses a state it cannot read truthfully (``eval`` of a run whose ``data.json`` is gone scored the
    corpus's current text as the run's held-out perplexity; a run still training was read mid-flight; an LM run
    without its tokenizer was exported without one), says one it can read with a caveat, reads the others; a
    refusal changes nothing in the run."""
    call, needs, warns = READERS[reader]
    breaks, says = STATES[state]
    with breaks(run):
        before = _snapshot(run)
        if state in needs:
            with pytest.raises((ValueError, FileNotFoundError), match=says) as err:
                call(run, tmp_path)
            assert state != "live" or err.type is RunLockedError
            assert _snapshot(run) == before
        elif state in warns:
            with pytest.warns(UserWarning, match=says):
                call(run, tmp_path)
        else:
            with warnings.catch_warnings():
                warnings.filterwarnings("error", message=".*(data.json|still training|tokenizer is missing)")
                call(run, tmp_path)


def test_a_checkpoint_named_explicitly_is_read_with_a_warning_while_its_run_trains(run):
    ckpt = run.latest_checkpoint()
    with held_elsewhere(run), pytest.warns(UserWarning, match=r"a checkpoint of a run still training \(pid 4242"):
        assert load_checkpoint_model(ckpt)[1]["step"] == 4


def test_a_live_run_is_refused_by_the_dry_run_as_by_the_runner(run):
    from coupled_qk.study.executor import PlannedRun, planned_state

    cfg = TrainConfig.from_dict({**run.read_config(), "out_dir": str(run.path), "device": "cpu"})
    assert planned_state(PlannedRun(cfg, "run")).startswith("continue")
    with held_elsewhere(run):
        assert planned_state(PlannedRun(cfg, "run")).startswith("refused: being written by pid 4242")


# ------------------------------------------------------------------------------------------ kind 3: a run's files


def _run_files(folder: RunFolder) -> list[Path]:
    """Every file of the run, and the layout's files it does not hold (yet): its own either way."""
    absent = [folder.interrupted_results_path, folder.lock_path, folder.tensorboard_dir / "events.out"]
    return sorted(p for p in folder.path.rglob("*") if p.is_file()) + absent


def test_no_command_replaces_a_file_of_a_run(run, capsys):
    """``eval RUN --json RUN/config.json --overwrite`` replaced the run's config (it could no longer be resumed):
    every file of a run, and every entry the layout gives it, is refused as an output, whatever --overwrite says,
    before any work; nothing of the run changes."""
    from coupled_qk.cli import main

    before = _snapshot(run)
    for path in _run_files(run):
        assert run_file_owner(path) == run, path
        capsys.readouterr()
        assert main(["eval", str(run.path), "--json", str(path), "--overwrite"]) == 2, path
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"is a file of the training run {run.path}" in err[0], err
    assert _snapshot(run) == before


def test_output_folders_inside_a_run_are_refused_too(run, capsys):
    """Commands writing folders (``export HF_DIR``, ``analyze --out-dir``) refuse a run or one of its folders, naming
    the run (before the files those commands do not write), --overwrite or not."""
    pytest.importorskip("transformers")
    from coupled_qk.cli import main

    before = _snapshot(run)
    folders = [run.path, run.latest_checkpoint(), run.best_checkpoint(), run.tokenizer_dir]
    for folder in folders:
        for argv in (["export", str(run.path), str(folder)], ["analyze", str(run.path), "--out-dir", str(folder)]):
            assert main([*argv, "--overwrite"]) == 2, argv
            assert "training run" in capsys.readouterr().err, argv
    assert _snapshot(run) == before


def test_paths_that_are_no_file_of_a_run(run, tmp_path):
    assert run_file_owner(run.glue_dir / "results.json") is None  # glue's own output folder for the run
    assert run_file_owner(run.path / "notes.json") is None  # not a layout entry
    assert run_file_owner(tmp_path / "elsewhere.json") is None
    lone = shutil.copytree(run.latest_checkpoint(), tmp_path / "lone")  # a checkpoint folder copied out of its run
    assert run_file_owner(lone / "state.json") == RunFolder(lone)


# ------------------------------------------------------------------------------------------ kind 10


@pytest.mark.parametrize(
    "saved, now, dtype, expected",
    [
        (None, "bf16", "auto", "bf16"),  # a checkpoint from before precisions were recorded: this session's
        ("fp32", "fp32", "auto", "fp32"),
        ("bf16", "fp32", "auto", "bf16"),  # --compile dropped on a CPU with native bf16: still bf16
        ("fp32", "bf16", "auto", "fp32"),  # --compile added, or moved to a GPU: still fp32
        ("bf16", "fp16", "fp16", ValueError),  # explicitly another precision: refused
    ],
)
def test_a_resume_continues_in_the_precision_the_run_started_in(saved, now, dtype, expected):
    cfg = TrainConfig(dtype=dtype, max_steps=1, out_dir="r")
    said = []
    state = {"step": 7, **({"precision": saved} if saved else {})}
    if expected is ValueError:
        with pytest.raises(ValueError, match=rf"the run trained in {saved} until step 7.*--dtype {saved}"):
            RunFolder.resume_precision(state, now, cfg, said.append)
        return
    assert RunFolder.resume_precision(state, now, cfg, said.append) == expected
    assert said == ([] if expected == now else [said[0]]) and all(f"continuing in {saved}" in s for s in said)


def test_hf_generate_refuses_a_right_padded_prompt_and_left_padding_generates_each_prompt():
    pytest.importorskip("transformers")
    from coupled_qk import GPT, GPTConfig
    from coupled_qk.hf import CoupledQKForCausalLM

    torch.manual_seed(0)
    lm = CoupledQKForCausalLM.from_gpt(GPT(GPTConfig(vocab_size=40, block_size=16, n_layer=1, d_model=16, n_heads=2)))
    lm.eval()
    short, long = torch.tensor([[5, 6]]), torch.tensor([[7, 8, 9, 10]])
    right = torch.tensor([[5, 6, 0, 0], [7, 8, 9, 10]])
    with pytest.raises(ValueError, match=r"attention_mask row 0 has padding after its real tokens \(right padding\)"):
        lm.generate(right, attention_mask=torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]), max_new_tokens=3)
    left = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
    out = lm.generate(left, attention_mask=torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]]), max_new_tokens=3)
    for row, alone in ((0, short), (1, long)):
        assert torch.equal(out[row, -3:], lm.generate(alone, max_new_tokens=3)[0, -3:])


def test_a_run_still_training_before_its_first_checkpoint_is_named_as_such(tmp_path):
    """A live run without a checkpoint yet is "still training", not "no checkpoint"."""
    folder = RunFolder(tmp_path / "starting")
    folder.path.mkdir()
    folder.config_path.write_text("{}")
    with held_elsewhere(folder), pytest.raises(RunLockedError, match=r"still training \(pid 4242"):
        load_checkpoint_model(folder.path)
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_checkpoint_model(folder.path)

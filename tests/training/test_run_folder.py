"""RunFolder: the run-folder layout, as written by train() and read by eval, analyze and the experiment runner."""

from __future__ import annotations

import ast
import contextlib
import fnmatch
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coupled_qk.analysis.analyze import analyze_checkpoints
from coupled_qk.checks.values import coerce, field_types
from coupled_qk.training.config import TrainConfig
from coupled_qk.training.run_folder import RunFolder


def test_layout_matches_what_train_writes(tiny_cfg, tmp_path):
    from coupled_qk.training.loop import train

    res = train(tiny_cfg(max_steps=4, checkpoint_interval=2, tensorboard=True))
    run = RunFolder(res["config"]["out_dir"])
    assert run.path == tmp_path / "run" and run.path / "latest" == run.latest_path
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
    run = RunFolder(tmp_path / "nothing")
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
    run = RunFolder(tmp_path / "r")
    run.write_results({"steps": 3, "path": tmp_path})  # non-JSON values are written with str()
    with pytest.warns(UserWarning, match=r"unknown results key\(s\) 'path'"):
        assert run.read_results() == {"steps": 3, "path": str(tmp_path)}
    run.mark_interrupted()
    assert not run.is_finished() and json.loads(run.interrupted_results_path.read_text())["steps"] == 3
    for name in ("config.json", "model_config.json", "data.json", "metrics.jsonl", "notes.txt"):
        (run.path / name).write_text("{}")
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
    from coupled_qk.training.lock import RunLockedError

    run = RunFolder(tmp_path / "r")
    run.path.mkdir()
    for name in ("config.json", "metrics.jsonl"):
        (run.path / name).write_text("{}")
    run.tokenizer_dir.mkdir()
    with run.lock():
        with pytest.raises(RunLockedError, match="is in use by pid"):
            run.remove_partial()
        assert run.config_path.is_file() and run.metrics_path.is_file() and run.tokenizer_dir.is_dir()
    run.remove_partial()  # the writer is gone: now it is a killed run, cleaned
    assert not run.config_path.exists() and not run.tokenizer_dir.exists() and not (run.path / ".lock").exists()


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10**12) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=4), inner, max_size=2),
    max_leaves=4,
)


@given(field=st.sampled_from(sorted(field_types(TrainConfig))), value=_JSON)
def test_saved_config_fields_are_of_their_declared_kind_or_one_line_naming_them(tmp_path_factory, field, value):
    """eval, analyze, generate and --resume read a run's config.json back without building a TrainConfig:
    ``"corpus": 5`` was a TypeError traceback and ``"task_options": []`` (or null, 0, "") was read as ``{}``. Any
    value of any field is now either of the field's declared kind (so reading it needs no conversion) or one
    ValueError naming the file and the field."""
    run = RunFolder(tmp_path_factory.mktemp("run"))
    saved = {**TrainConfig(max_steps=1).to_dict(), field: value}
    run.config_path.write_text(json.dumps(saved))
    try:
        got = run.read_config()
    except ValueError as exc:
        assert str(exc).startswith(f"{run.config_path}: {field}=") and "\n" not in str(exc)
    else:
        assert got == saved
        assert coerce(field, value, field_types(TrainConfig)[field]) == value  # already of its kind
        assert not isinstance(value, bool) or field_types(TrainConfig)[field] in (bool, bool | None)
        assert not isinstance(value, str) or value.strip()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished one-step run (trained once for the module); tests copy it before editing it."""
    from coupled_qk.training.loop import train
    from tests.conftest import write_corpus

    root = tmp_path_factory.mktemp("finished")
    train(
        TrainConfig.from_dict(
            dict(
                corpus=str(write_corpus(root / "corpus", (100, 10, 10))),
                tokenizer="bpe-300",
                cache_dir=str(root / "cache"),
                out_dir=str(root / "run"),
                model=dict(n_layer=1, d_model=32, n_heads=2, block_size=16),
                batch_size=2,
                max_steps=1,
                warmup_steps=1,
                eval_interval=1,
                eval_batches=1,
                progress=False,
                tensorboard=False,
            )
        )
    )
    return root / "run"


@pytest.mark.parametrize(
    "field, value",
    [
        ("corpus", 5),
        ("corpus", ["a"]),
        ("corpus", ""),
        ("data_dir", 3),
        ("cache_dir", {}),
        ("task_options", []),
        ("task_options", None),
        ("task_options", 0),
        ("task_options", ""),
    ],
)
def test_eval_analyze_generate_name_a_saved_field_of_another_kind(finished_run, tmp_path, capsys, field, value):
    import shutil

    from coupled_qk.cli import main

    run = RunFolder(shutil.copytree(finished_run, tmp_path / "run"))
    run.config_path.write_text(json.dumps({**run.read_config(), field: value}))
    for args in (
        ["eval", str(run.path)],
        ["analyze", str(run.path), "--out-dir", str(tmp_path / "an")],
        ["generate", str(run.path), "--max-new-tokens", "1"],
    ):
        capsys.readouterr()
        assert main(args) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{run.config_path}: {field}=" in err[0], (args, err)


def _copy_with_own_corpus(finished_run, where):
    """A copy of ``finished_run`` in ``where/run`` whose config names a copy of its corpus (``where/corpus``)."""
    import shutil

    corpus = Path(shutil.copytree(finished_run.parent / "corpus", where / "corpus"))
    run = RunFolder(shutil.copytree(finished_run, where / "run"))
    run.config_path.write_text(json.dumps({**run.read_config(), "corpus": str(corpus)}))
    return run, corpus


@settings(max_examples=8)
@given(
    split=st.sampled_from(["train", "valid", "test"]),
    added=st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=40),  # control: refused
    recorded=st.sampled_from(["sha256", "tokens only"]),
)
def test_a_corpus_changed_since_training_is_refused_by_eval_and_warned_by_analyze(finished_run, split, added, recorded):
    """Text appended to a corpus file after training re-split and re-tokenized silently: ``eval`` reported
    "held-out" perplexity of other text. Now eval of the run's own corpus refuses a changed evaluated split (one line
    naming data.json; ``--corpus`` evaluates the current text on purpose), analyze warns, an unchanged split passes.
    A run written before ``text_sha256`` was recorded ("tokens only") is compared by its token counts."""
    import tempfile

    from coupled_qk.training.evaluate import evaluate_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        run, corpus = _copy_with_own_corpus(finished_run, Path(tmp))
        if recorded == "tokens only":
            data = run.read_data()
            del data["text_sha256"]
            run.data_path.write_text(json.dumps(data))
        with open(corpus / f"{split}.txt", "a", encoding="utf-8") as f:
            f.write(" zebra quokka " + added)  # always new tokens, so a token count changes too
        if split in ("valid", "test"):
            with pytest.raises(
                ValueError,
                match=rf"changed since {run.path} trained on it \({run.data_path} vs now: "
                rf"tokens.{split}: ",
            ) as err:
                evaluate_checkpoint(run.path)
            assert "\n" not in str(err.value)
        else:
            assert evaluate_checkpoint(run.path)["valid"]["n_tokens"] > 0
        assert evaluate_checkpoint(run.path, corpus=str(corpus))["test"]["n_tokens"] > 0  # on purpose: as it is now
        with (
            pytest.warns(UserWarning, match=f"the valid split of .* changed since {run.path}")
            if (split == "valid" and recorded == "sha256")
            else contextlib.nullcontext()
        ):
            analyze_checkpoints([run.path], out_dir=Path(tmp) / "an", make_plots=False)


def test_resume_refuses_data_that_changed_since_the_run_recorded_it(tiny_cfg, tiny_corpus):
    """``train --resume`` re-split and re-tokenized a corpus edited since, overwrote data.json and trained on.
    Now it compares the data with data.json (token counts and text SHA-256s) before writing anything; a run
    written before ``text_sha256`` was recorded is compared by its token counts and resumes when they match."""
    from coupled_qk.training.loop import train

    train(tiny_cfg(max_steps=3, stop_after_steps=2))
    run = RunFolder(tiny_cfg().out_dir)
    data = run.read_data()
    assert set(data["text_sha256"]) == {"train", "valid", "test"}
    before = (tiny_corpus / "test.txt").read_text()
    (tiny_corpus / "test.txt").write_text(before + "\n\nzebra quokka zebra\n")
    with pytest.raises(
        ValueError,
        match=rf"cannot resume {run.path}: its data is not what it trained on \("
        rf"{run.data_path} vs now: tokens.test: 1,997 recorded, 2,0\d\d now; "
        r"text_sha256.test: \w{12}\.\.\. recorded",
    ):
        train(tiny_cfg(max_steps=3, resume=True))
    assert run.read_data() == data  # nothing written
    (tiny_corpus / "test.txt").write_text(before)
    del data["text_sha256"]  # as a run written before the fingerprints were recorded
    run.data_path.write_text(json.dumps(data))
    assert train(tiny_cfg(max_steps=3, resume=True))["steps"] == 3


def test_resume_without_data_json_says_the_data_is_not_checked(tiny_cfg, tiny_corpus):
    """``data.json`` deleted: a resume compared nothing and trained on an edited corpus without a word."""
    from coupled_qk.training.loop import train

    train(tiny_cfg(max_steps=3, stop_after_steps=2))
    run = RunFolder(tiny_cfg().out_dir)
    run.data_path.unlink()
    (tiny_corpus / "test.txt").write_text((tiny_corpus / "test.txt").read_text() + "\n\nzebra quokka zebra\n")
    with pytest.warns(UserWarning, match=rf"{run.data_path} is missing: this resume cannot check that the data"):
        assert train(tiny_cfg(max_steps=3, resume=True))["steps"] == 3


def test_an_unknown_key_of_a_run_config_json_is_refused_by_every_reader_naming_its_close_match(
    finished_run, tmp_path, capsys
):
    """A hand-edited ``config.json`` with a typo (``"seeed"``) took no effect without a word; every reader
    (``eval``, ``analyze``, ``generate``, ``--resume``) now names the file, the key and its close match."""
    import shutil

    from coupled_qk.cli import main

    run = RunFolder(shutil.copytree(finished_run, tmp_path / "run"))
    run.config_path.write_text(json.dumps({**run.read_config(), "seeed": 3}))
    for args in (
        ["eval", str(run.path)],
        ["analyze", str(run.path), "--out-dir", str(tmp_path / "an")],
        ["generate", str(run.path), "--max-new-tokens", "1"],
        ["train", "--out-dir", str(run.path), "--resume", "--max-steps", "2"],
    ):
        capsys.readouterr()
        assert main(args) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert any(
            f"{run.config_path}: unknown TrainConfig key(s) 'seeed' (did you mean 'seed'?)" in line for line in err
        ), (args, err)


def test_unknown_keys_of_the_files_the_project_writes_are_warnings_naming_the_close_match(finished_run, tmp_path):
    """results.json, state.json and data.json are the project's own files, which a later version may extend:
    an unknown key is a warning naming it (and its close match), and the file is still read."""
    import shutil

    from coupled_qk.training.checkpoint_format import Checkpoint

    run = RunFolder(shutil.copytree(finished_run, tmp_path / "run"))
    results = run.read_results()
    run.results_path.write_text(json.dumps({**results, "finall": {}, "config": {**results["config"], "lrr": 1}}))
    with pytest.warns(UserWarning) as caught:
        assert run.read_results()["final"] == results["final"]
    said = [str(w.message) for w in caught]
    assert any("unknown results key(s) 'finall' (did you mean 'final'?), ignored" in m for m in said), said
    assert any("unknown config key(s) 'lrr' (did you mean 'lr'?)" in m for m in said), said
    state_path = run.latest_checkpoint() / "state.json"
    state_path.write_text(json.dumps({**json.loads(state_path.read_text()), "tokenz": 1}))
    with pytest.warns(
        UserWarning,
        match=r"state.json: unknown checkpoint state key\(s\) 'tokenz' \(did you mean "
        r"'tokens'\?\)",
    ):
        assert Checkpoint(run.latest_checkpoint()).state()["step"] == 1

    class Task:
        data_identity = ("tokens",)

        def describe(self):
            return {"tokens": {"train": 5}, "vocab_size": 300}

    run.data_path.write_text(json.dumps({"tokens": {"train": 5}, "vocab_sise": 300}))
    with pytest.warns(
        UserWarning,
        match=r"data.json: unknown data description key\(s\) 'vocab_sise' \(did you "
        r"mean 'vocab_size'\?\)",
    ):
        run.check_data(Task())


def test_unknown_task_options_and_config_fields_name_their_close_match():
    from coupled_qk.models.config import GPTConfig
    from coupled_qk.training.tasks import check_task_options

    with pytest.raises(
        ValueError,
        match=r"unknown MQAR task_options 'train_slice' \(did you mean 'train_slices'\?\); valid options",
    ):
        check_task_options("mqar", {"train_slice": "64:4", "test_slices": "64:4"})
    with pytest.raises(ValueError, match=r"unknown GPTConfig field\(s\) 'n_layers' \(did you mean 'n_layer'\?\)"):
        GPTConfig.from_dict({"n_layers": 2})


# ------------------------------------------------------------------------------------------ one place for the layout

SRC = Path(__file__).resolve().parents[2] / "src" / "coupled_qk"
OWNERS = {"training/run_folder.py", "training/checkpoint_format.py"}
"""The run folder (its layout) and the format of one checkpoint folder: the only modules naming their entries."""

LAYOUT_LITERAL = re.compile(
    r"""["'](latest|\.lock|results\.json|results\.interrupted\.json|metrics\.jsonl|model_config\.json|data\.json"""
    r"""|state\.json|checksums\.json|optimizer\.pt|rng\.pt|model\.safetensors|config\.json|tokenizer\.json)["']"""
    r"""|["'](ckpt|best|\.ckpt)-(\{|\*|\d)"""  # ckpt-<step>, best-<step>, their globs and temporary folders
    r"""|/ *f?["'](tokenizer|tensorboard|best|latest)["'](?! */)"""  # a path joined with a folder entry
)
"""A run folder's entry as a string literal: what ``git grep -nE`` finds with the same pattern (``["']latest["']``,
``["']ckpt-``, ``/ "tokenizer"``, ...). ``"best"`` and ``"tokenizer"`` alone are also keys of the results and the
config: only their path joins count."""

FORMAT_OWNERS = {"tokenizer.json": {"data/tokenizers.py"}}
"""Files of another format that a run folder holds: a saved tokenizer's file is the tokenizer's (``TOKENIZER_FILE``);
the run folder reads it through that name."""


def layout_literals(text: str, where: str) -> list[str]:
    hits = []
    for number, line in enumerate(text.splitlines(), 1):
        for m in LAYOUT_LITERAL.finditer(line):
            name = next(g for g in m.groups() if g is not None)
            if where not in FORMAT_OWNERS.get(name, ()):
                hits.append(f"{where}:{number}: {line.strip()}")
    return hits


def test_no_layout_literal_outside_the_run_folder():
    """The layout lives in one place: no other source file names a run folder's entry (``run.results_path``,
    ``RunFolder.RESULTS``, ``open_run``... instead)."""
    hits = []
    for path in sorted(SRC.rglob("*.py")):
        where = path.relative_to(SRC).as_posix()
        if where not in OWNERS:
            hits += layout_literals(path.read_text(), where)
    assert not hits, "layout literals outside training/run_folder.py:\n" + "\n".join(hits)


def test_the_layout_check_finds_what_it_looks_for():
    bad = 'x = run / "latest"\ny = Path(d) / "tokenizer"\nz = f"ckpt-{s:08d}"\nw = "results.json"\nv = ".lock"\n'
    assert len(layout_literals(bad, "m.py")) == 5
    fine = 'rec.get("best")\nroot / "tokenizer" / "gpt2"\n"best-validation checkpoints"\ncfg["tokenizer"]\n'
    assert layout_literals(fine, "m.py") == []


def test_the_layout_docstring_lists_every_entry(tiny_cfg):
    """One layout docstring (``training/run_folder.py``) names every entry a run folder may hold, each entry a
    trained run holds is one of them (and the run's own), and the checkpoint format's names every file."""
    from coupled_qk.training import checkpoint_format, run_folder
    from coupled_qk.training.loop import train

    doc = run_folder.__doc__
    for pattern in (*run_folder.RUN_LAYOUT, RunFolder.LOCK):
        assert pattern.replace("*", "<step>") in doc, pattern
    for name in ("WEIGHTS", "MODEL_CONFIG", "STATE", "OPTIMIZER", "RNG", "CHECKSUMS"):
        assert getattr(checkpoint_format, name) in checkpoint_format.__doc__, name
    cfg = tiny_cfg(max_steps=4, checkpoint_interval=2, tensorboard=True, best_metric="valid/loss", eval_interval=2)
    run = RunFolder(cfg.out_dir)
    with run.lock():
        entries = sorted(run.path.iterdir())
    train(cfg)
    entries = sorted({*entries, *run.path.iterdir()})
    for entry in entries:
        assert run.owns(entry), entry
        pattern = entry.name + ("/" if entry.is_dir() else "")
        assert any(fnmatch.fnmatchcase(pattern, p) for p in (*run_folder.RUN_LAYOUT, RunFolder.LOCK)), entry
    assert {e.name for e in entries} >= {"latest", "best", ".lock", "tokenizer", "tensorboard", "results.json"}
    assert any(e.name.startswith("best-") for e in entries) and any(e.name.startswith("ckpt-") for e in entries)


def test_run_folder_names_have_one_import_path():
    """No other module re-exports a name of the run folder or of the checkpoint format (one import path each)."""
    from coupled_qk.training import checkpoint_format, run_folder

    names = set(run_folder.__all__) | set(checkpoint_format.__all__)
    hits = []
    for path in sorted(SRC.rglob("*.py")):
        where = path.relative_to(SRC).as_posix()
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
                listed = {e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)}
                if where not in OWNERS:
                    hits += [f"{where}: {n}" for n in sorted(listed & names)]
    assert not hits, hits

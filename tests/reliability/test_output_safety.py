"""Output safety, one rule (coupled_qk.output_dir): around every writing command, a snapshot of the folder tree
before and after proves that a refused output changes nothing, that nothing outside the output folder changes,
and that no pre-existing file is modified unless ``--overwrite`` (or the command's resume path) allows it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import reliability_profile  # noqa: F401  (the example budget)
from hypothesis import given
from hypothesis import strategies as st

from coupled_qk.checks.paths import output_location
from coupled_qk.cli import main
from coupled_qk.output_dir import RECORD, OutputDir, OutputRefused, output_file


def snapshot(root: Path) -> dict:
    """``{relative path: (kind, sha256, mtime_ns)}`` of everything under ``root`` (folders included)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            p = Path(dirpath) / d
            out[str(p.relative_to(root)) + "/"] = ("dir", None, None)
        for f in filenames:
            p = Path(dirpath) / f
            out[str(p.relative_to(root))] = ("file", hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
    return out


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A user's folder: a finished-looking run, personal files, and the current directory inside it."""
    (tmp_path / "cwd").mkdir()
    (tmp_path / "cwd" / "notes.txt").write_text("my notes")
    (tmp_path / "cwd" / "config.json").write_text('{"mine": true}')
    run = tmp_path / "run"
    (run / "ckpt-00000004").mkdir(parents=True)
    (run / "ckpt-00000004" / "model.safetensors").write_bytes(b"weights")
    (run / "config.json").write_text("{}")
    (run / "latest").write_text("ckpt-00000004\n")
    (run / "results.json").write_text('{"final": {}}')
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("\\documentclass{article}")
    (tmp_path / "a_file").write_text("x")
    monkeypatch.chdir(tmp_path / "cwd")
    return tmp_path


REFUSED = {
    "mqar into a finished run": ["mqar", "--out-dir", "{run}"],
    "mqar into a user's folder": ["mqar", "--out-dir", "{mine}"],
    "mqar into the current folder": ["mqar", "--out-dir", "."],
    "mqar into a file": ["mqar", "--out-dir", "{a_file}"],
    "bench into a user's folder": ["bench", "--out-dir", "{mine}"],
    "bench into a file": ["bench", "--out-dir", "{a_file}"],
    "bench under a file": ["bench", "--out-dir", "{a_file}/sub"],
    "eval json onto a file": ["eval", "{run}", "--json", "{a_file}"],
    "eval json onto a folder": ["eval", "{run}", "--json", "{mine}"],
    "analyze into a user's folder": ["analyze", "{run}", "--out-dir", "{mine}"],
    "analyze into the current folder": ["analyze", "{run}", "--out-dir", "."],
    "export into a user's folder": ["export", "{run}", "{mine}", "--overwrite"],
    "export into a file": ["export", "{run}", "{a_file}"],
    "train into a user's folder": ["train", "--out-dir", "{mine}", "--max-steps", "2"],
    "train into the current folder": ["train", "--out-dir", ".", "--max-steps", "2"],
    "train into a file": ["train", "--out-dir", "{a_file}", "--max-steps", "2"],
    "compare into a finished run": ["compare", "--out-dir", "{run}", "--max-steps", "2"],
    "compare into the current folder": ["compare", "--out-dir", ".", "--max-steps", "2"],
    "demo into a user's folder": ["demo", "--out-dir", "{mine}", "--corpus", "{a_file}"],
    "glue into a user's folder": ["glue", "{run}", "--out-dir", "{mine}"],
    "glue of a missing run": ["glue", "{mine}/nothing", "--out-dir", "{mine}/../g"],
    "claims into a user's folder": ["claims", "--protocol", "smoke", "--out-dir", "{mine}", "--report-only"],
    "claims into a file": ["claims", "--protocol", "smoke", "--out-dir", "{a_file}", "--report-only"],
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_outputs_change_nothing(case, world, capsys):
    names = {"run": world / "run", "mine": world / "mine", "a_file": world / "a_file"}
    argv = [a.format(**names) for a in REFUSED[case]]
    before = snapshot(world)
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, (case, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert snapshot(world) == before, case


@pytest.mark.slow
def test_bench_result_is_replaced_only_with_overwrite(tmp_path, capsys):
    """A second bench into the same folder is refused before measuring; --overwrite replaces only its files."""
    argv = [
        "bench",
        "--preset",
        "tiny",
        "--variants",
        "coupled",
        "--repeats",
        "1",
        "--warmup",
        "1",
        "--batch-size",
        "2",
        "--seq-len",
        "8",
        "--device",
        "cpu",
        "--out-dir",
        str(tmp_path / "b"),
    ]
    assert main(argv) == 0
    (tmp_path / "b" / "README.md").write_text("about these results")
    before = snapshot(tmp_path)
    assert main(argv) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert snapshot(tmp_path) == before
    assert main([*argv, "--overwrite"]) == 0
    after = snapshot(tmp_path)
    assert after["b/README.md"] == before["b/README.md"]
    assert sorted(after) == sorted(before)  # the same files, no temporary leftovers


# --------------------------------------------------------------------------------- the rule itself, generated

NAMES = st.text(
    st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/\\"), min_size=1, max_size=12
).filter(lambda s: s not in (".", "..") and not s.startswith(".") and s.strip() == s)


@given(foreign=NAMES, data=st.binary(max_size=64))
def test_a_folder_with_a_file_outside_the_layout_is_refused(tmp_path_factory, foreign, data):
    root = tmp_path_factory.mktemp("out")
    if foreign in ("results.json", "summary.md"):
        return
    (root / foreign).write_bytes(data)
    before = snapshot(root)
    with pytest.raises(OutputRefused, match="--out-dir"):
        OutputDir(root, "--out-dir", layout=("results.json", "summary.md"), overwrite=True)
    assert snapshot(root) == before


@given(name=NAMES, old=st.binary(max_size=32), new=st.text(max_size=32), overwrite=st.booleans())
def test_an_existing_file_is_replaced_only_with_overwrite(tmp_path_factory, name, old, new, overwrite):
    root = tmp_path_factory.mktemp("out")
    (root / name).write_bytes(old)
    out = OutputDir(root, "--out-dir", layout=("*",), overwrite=overwrite)
    if overwrite:
        out.write_text(name, new)
        assert (root / name).read_text(encoding="utf-8") == new
        out.write_text(name, new + "again")  # written in this run: may be rewritten
    else:
        with pytest.raises(OutputRefused, match="--overwrite"):
            out.write_text(name, new)
        assert (root / name).read_bytes() == old
    assert sorted(p.name for p in root.iterdir() if p.name != RECORD) == [name]  # no temporary file left


def test_a_failed_figure_leaves_the_previous_one(tmp_path):
    OutputDir(tmp_path, layout=("fig.png",)).write_bytes("fig.png", b"old")  # an earlier run's figure (recorded)
    out = OutputDir(tmp_path, layout=("fig.png",), rewrite=("fig.png",))

    def draw(path):
        Path(path).write_bytes(b"half")
        raise RuntimeError("plotting failed")

    with pytest.raises(RuntimeError):
        out.write_with("fig.png", draw)
    assert sorted(p.name for p in tmp_path.iterdir()) == [RECORD, "fig.png"]
    assert (tmp_path / "fig.png").read_bytes() == b"old"


@pytest.mark.parametrize(
    "value,match", [("", "empty"), ("  ", "empty"), (None, "path"), (3, "path"), ("a\x00b", "NUL")]
)
def test_path_values(value, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        OutputDir(value, "--out-dir")
    with pytest.raises(ValueError, match=match):
        output_file("--json", value)
    with pytest.raises(ValueError, match=match):
        output_location("--cache-dir", value)


def test_output_file_kinds(tmp_path):
    (tmp_path / "f.json").write_text("{}")
    with pytest.raises(OutputRefused, match="--overwrite"):
        output_file("--json", tmp_path / "f.json")
    assert output_file("--json", tmp_path / "f.json", overwrite=True) == tmp_path / "f.json"
    with pytest.raises(ValueError, match="is a folder"):
        output_file("--json", tmp_path)
    with pytest.raises(ValueError, match="is a file"):
        output_file("--json", tmp_path / "f.json" / "x.json")
    with pytest.raises(ValueError, match="is a file"):
        OutputDir(tmp_path / "f.json")
    assert (tmp_path / "f.json").read_text() == "{}"


@given(missing=st.lists(NAMES, min_size=1, max_size=3), name=NAMES)
def test_an_output_file_in_a_missing_folder_is_refused_before_any_work(tmp_path_factory, missing, name):
    """`eval --json /nonexist/dir/x.json` evaluated everything, then failed naming a hidden temporary file: a
    file's folder must exist (it is not created), checked up front, naming the option."""
    root = tmp_path_factory.mktemp("out")
    target = root.joinpath(*missing, name)
    with pytest.raises(ValueError, match=r"^--json=.*: the folder .* does not exist"):
        output_file("--json", target)
    assert list(root.iterdir()) == []
    target.parent.mkdir(parents=True)
    assert output_file("--json", target) == target


def test_eval_json_in_a_missing_folder_is_one_line_before_loading(world, capsys):
    before = snapshot(world)
    assert main(["eval", str(world / "run"), "--json", str(world / "missing" / "x.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"coupled-qk eval: error: --json={str(world / 'missing' / 'x.json')!r}: the folder "
        f"{world / 'missing'} does not exist; create it first or choose another path"
    )
    assert snapshot(world) == before


def test_an_atomic_write_into_a_missing_folder_names_the_file(tmp_path):
    from coupled_qk.files import write_text_atomic

    with pytest.raises(
        FileNotFoundError,
        match=rf"^cannot write {tmp_path}/no/x.json: the folder {tmp_path}/no "
        "does not exist$",
    ):
        write_text_atomic(tmp_path / "no" / "x.json", "{}")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_unwritable_folder_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(ValueError, match="not writable"):
            OutputDir(locked / "out")
    finally:
        locked.chmod(0o700)


def test_a_safetensors_write_error_is_one_oserror_naming_the_file(tmp_path, monkeypatch):
    """safetensors reports a full disk with its own exception type: it becomes an OSError naming the file, and
    the previous checkpoint and ``latest`` are untouched."""
    import torch
    from safetensors import SafetensorError

    from coupled_qk import GPTConfig
    from coupled_qk.training import checkpoint_format
    from coupled_qk.training.run_folder import RunFolder

    cfg = GPTConfig.from_preset("tiny", n_layer=1, d_model=16, n_heads=2, vocab_size=32, block_size=8)
    state = {"w": torch.zeros(2)}
    RunFolder(tmp_path).save(state, cfg, None, {"step": 1})
    before = snapshot(tmp_path)

    def full_disk(*a, **k):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(checkpoint_format, "save_file", full_disk)
    with pytest.raises(OSError, match="model.safetensors") as err:
        RunFolder(tmp_path).save(state, cfg, None, {"step": 2})
    assert snapshot(tmp_path) == before
    # the full disk it reports is ENOSPC ("coupled-qk train: error: [Errno 0] cannot write ..." before)
    assert err.value.errno == 28 and str(err.value).startswith("[Errno 28] cannot write ")


def test_make_task_claims_its_folder(tmp_path):
    from coupled_qk.hf.harness import make_task

    src = tmp_path / "text.txt"
    src.write_text("= A =\n\nsome words here .\n\n= B =\n\nmore words .\n")
    out = tmp_path / "tasks"
    yaml = make_task("perplexity", src, out, name="t1")
    before = snapshot(tmp_path)
    with pytest.raises(OutputRefused, match="--overwrite"):
        make_task("perplexity", src, out, name="t1")
    assert snapshot(tmp_path) == before
    assert make_task("perplexity", src, out, name="t1", overwrite=True) == yaml
    (out / "notes.txt").write_text("mine")
    with pytest.raises(OutputRefused, match="notes.txt"):
        make_task("perplexity", src, out, name="t2", overwrite=True)
    for bad in ("", "../x", "a/b", " "):
        with pytest.raises(ValueError, match="name"):
            make_task("perplexity", src, tmp_path / "other", name=bad)


@pytest.mark.parametrize("extra", [[], ["--sweep"], ["--compile"], ["--dtype", "bf16"]])
@pytest.mark.parametrize("mode", ["train", "decode", "memory", "fastpath"])
def test_every_bench_result_name_is_in_the_results_layout(mode, extra):
    """What any mode of bench writes can be replaced with --overwrite: its file names are inside the layout the
    results folder is checked against (the fastpath mode's were not, so its rerun was refused even with
    --overwrite)."""
    import fnmatch

    from coupled_qk.cli import build_parser
    from coupled_qk.commands import bench

    assert set(bench.BENCH_MODES) == {"train", "decode", "memory", "fastpath"}
    args = build_parser("bench").parse_args(["bench", "--mode", mode, "--device", "cpu", *extra])
    stem = bench._stem(args)
    for suffix in (".json", ".md", ".png"):
        assert any(fnmatch.fnmatch(stem + suffix, pat) for pat in bench.RESULTS_LAYOUT), (stem, bench.RESULTS_LAYOUT)


# ------------------------------------------------------------------ ours to replace: recognised, never a run's file

WHATS = ("a comparison", "an MQAR sweep", "a GLUE study", "a claims report", "bench", "analyze", "export", "eval")
"""The names under which the commands record their outputs (``OutputDir(what=...)``,
``output_file(written_by=...)``)."""


def recorded(folder: Path, name: str, what: str, text: str = "earlier output") -> Path:
    """``folder/name`` written and recorded as ``what``'s output."""
    return OutputDir(folder, layout=("*", "*/"), what=what).write_text(name, text)


@given(
    writer=st.sampled_from((*WHATS, None)),
    replacer=st.sampled_from(WHATS),
    edited=st.booleans(),
    overwrite=st.booleans(),
    resume_path=st.booleans(),
)
def test_a_file_is_replaced_only_when_it_is_this_commands_earlier_output(
    tmp_path_factory, writer, replacer, edited, overwrite, resume_path
):
    """The rule over every command's name: another command's recorded output is never replaced, even with
    ``--overwrite``; an unrecorded or since-edited file only with ``--overwrite``; the command's own unchanged
    output with ``--overwrite`` or on its resume path (``rewrite``)."""
    root = tmp_path_factory.mktemp("out")
    if writer is None:
        (root / "results.json").write_text("someone's file")
    else:
        recorded(root, "results.json", writer)
    if edited:
        (root / "results.json").write_text("edited by hand")
    before = snapshot(root)
    ours = writer == replacer and not edited
    allowed = writer in (None, replacer) and (overwrite or (ours and resume_path))

    def claim():
        rewrite = ("results.json",) if resume_path else ()
        return OutputDir(root, layout=("*",), what=replacer, overwrite=overwrite, rewrite=rewrite)

    if allowed:
        claim().write_text("results.json", "new")
        assert (root / "results.json").read_text() == "new"
        assert json.loads((root / RECORD).read_text())["files"]["results.json"]["written_by"] == replacer
    else:
        with pytest.raises(OutputRefused) as exc:
            claim().write_text("results.json", "new")  # a rewrite file is refused when claimed, before the work
        assert "results.json" in str(exc.value)
        expected = "was written by" if writer not in (None, replacer) else "--overwrite"
        assert expected in str(exc.value), str(exc.value)
        assert snapshot(root) == before


def test_a_rewrite_file_that_is_not_ours_is_refused_before_the_work(tmp_path):
    (tmp_path / "results.md").write_text("my own notes, named like a report")
    with pytest.raises(OutputRefused, match="not recognisably an earlier output"):
        OutputDir(tmp_path, layout=("results.md",), rewrite=("results.md",), what="a comparison")


RUN_FILES = st.sampled_from(
    ["config.json", "model_config.json", "results.json", "metrics.jsonl", "latest", "notes.json", "x.png"]
)


@given(name=RUN_FILES, sub=st.sampled_from(["", "ckpt-00000004/", "tokenizer/", "tensorboard/", "new/", "glue/"]))
def test_nothing_is_written_into_a_training_run(tmp_path_factory, name, sub):
    """Every path in a run folder (its own files, new names, its checkpoints) belongs to the run, except under
    ``glue/`` (``coupled-qk glue RUN``'s default output): refused for an output file and for an output folder,
    even with ``--overwrite``; nothing changes."""
    from coupled_qk.output_dir import run_folder_of

    root = tmp_path_factory.mktemp("w")
    run = root / "run"
    (run / "ckpt-00000004").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (run / "latest").write_text("ckpt-00000004\n")
    (run / "glue").mkdir()
    target = run / sub / name
    before = snapshot(root)
    if sub == "glue/":
        assert run_folder_of(target) is None
        return
    assert run_folder_of(target) == run.absolute()
    with pytest.raises(OutputRefused, match="training run"):
        output_file("--json", target, overwrite=True, written_by="eval")
    with pytest.raises(OutputRefused, match="training run"):
        OutputDir(run / sub, "--out-dir", layout=("*", "*/"), overwrite=True, what="analyze")
    assert snapshot(root) == before


def test_an_export_and_a_plain_folder_are_not_runs(tmp_path):
    from coupled_qk.output_dir import run_folder_of

    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    (tmp_path / "hf" / "model.safetensors").write_bytes(b"")
    assert run_folder_of(tmp_path / "hf") is None and run_folder_of(tmp_path / "hf" / "config.json") is None
    assert run_folder_of(tmp_path / "x" / "y.json") is None


def test_two_writers_of_one_folder_keep_every_record(tmp_path):
    """The record is updated under an OS lock: threads writing reports into one folder (as two study workers do)
    leave every file recorded."""
    import threading

    def write(k: int) -> None:
        out = OutputDir(tmp_path, layout=("*",), what="a claims report")
        for i in range(5):
            out.write_text(f"w{k}-{i}.md", f"{k} {i}")

    threads = [threading.Thread(target=write, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    files = json.loads((tmp_path / RECORD).read_text())["files"]
    assert sorted(files) == sorted(f"w{k}-{i}.md" for k in range(6) for i in range(5))
    assert all(files[n]["sha256"] == hashlib.sha256((tmp_path / n).read_bytes()).hexdigest() for n in files)


OTHERS_FILE = {  # a command, the file it writes (pre-created as another command's output), its arguments
    "eval": ("x.json", ["eval", "{run}", "--json", "{out}/x.json", "--overwrite"]),
    "compare": ("results.json", ["compare", "--out-dir", "{out}", "--corpus", "{corpus}", "--max-steps", "2"]),
    "mqar": ("summary.json", ["mqar", "--out-dir", "{out}", "--overwrite"]),
    "claims": ("smoke.json", ["claims", "--protocol", "smoke", "--out-dir", "{out}", "--report-only", "--overwrite"]),
    "bench": ("decode-tiny-cpu.json", ["bench", "--mode", "decode", "--device", "cpu", "--out-dir", "{out}"]),
    "analyze": ("analysis.json", ["analyze", "{run}", "--out-dir", "{out}", "--overwrite"]),
    "export": ("config.json", ["export", "{run}", "{out}", "--overwrite"]),
}
INSIDE_THE_RUN = {
    "eval --json RUN/config.json": ["eval", "{run}", "--json", "{run}/config.json", "--overwrite"],
    "eval --json RUN/results.json": ["eval", "{run}", "--json", "{run}/results.json", "--overwrite"],
    "eval --json RUN/notes.json": ["eval", "{run}", "--json", "{run}/notes.json", "--overwrite"],
    "eval --json RUN/ckpt/x.json": ["eval", "{run}", "--json", "{run}/ckpt-00000004/x.json", "--overwrite"],
    "analyze into the run": ["analyze", "{run}", "--out-dir", "{run}/analysis", "--overwrite"],
    "bench into the run": ["bench", "--out-dir", "{run}/bench", "--overwrite"],
    "mqar into the run": ["mqar", "--out-dir", "{run}/sweep", "--overwrite"],
    "compare into the run": ["compare", "--out-dir", "{run}/cmp", "--corpus", "{corpus}", "--max-steps", "2"],
    "claims into the run": ["claims", "--protocol", "smoke", "--out-dir", "{run}/c", "--report-only"],
    "export into the run": ["export", "{run}", "{run}/hf", "--overwrite"],
    "glue into the run itself": ["glue", "{run}", "--out-dir", "{run}"],
}


def _corpus(world: Path) -> Path:
    from tests.conftest import make_text

    path = world / "corpus.txt"
    path.write_text(make_text(200, 0))
    return path


@pytest.mark.parametrize("case", sorted(INSIDE_THE_RUN))
def test_no_command_writes_into_a_training_run(case, world, capsys):
    names = {"run": world / "run", "corpus": _corpus(world)}
    argv = [a.format(**names) for a in INSIDE_THE_RUN[case]]
    before = snapshot(world)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "training run" in err, (case, err)
    assert snapshot(world) == before


@pytest.mark.parametrize("command", sorted(OTHERS_FILE))
def test_no_command_replaces_another_commands_output_even_with_overwrite(command, world, capsys):
    name, argv = OTHERS_FILE[command]
    out = world / "out"
    out.mkdir()
    other = "a GLUE study" if command != "claims" else "a comparison"
    recorded(out, name, other)
    names = {"run": world / "run", "out": out, "corpus": _corpus(world)}
    argv = [a.format(**names) for a in argv]
    before = snapshot(world)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"was written by {other}" in err, (command, err)
    assert snapshot(world) == before


def test_a_link_into_a_training_run_is_the_runs(world):
    from coupled_qk.output_dir import run_folder_of

    (world / "link").symlink_to(world / "run")
    before = snapshot(world / "run")
    with pytest.raises(OutputRefused, match="training run"):
        OutputDir(world / "link" / "analysis", "--out-dir", layout=("*",), overwrite=True, what="analyze")
    assert run_folder_of(world / "link" / "x.json").resolve() == (world / "run").resolve()
    assert snapshot(world / "run") == before


ENTRIES = [
    *("config.json", "model_config.json", "data.json", "metrics.jsonl", "results.json", "latest", "model.safetensors"),
    *("ckpt-00000004/model.safetensors", "ckpt-00000004/state.json", "ckpt-x/model.safetensors", "notes.txt"),
    "best-00000002/model.safetensors",
]


@given(entries=st.sets(st.sampled_from(ENTRIES), max_size=5))
def test_outputs_refuse_exactly_the_folders_the_run_folder_calls_runs(tmp_path_factory, entries):
    """``output_dir.run_folder_of`` (every output check) finds a run where ``RunFolder.is_run`` (the run-folder object)
    says there is one, on any folder: a file in it, or the folder itself."""
    from coupled_qk.output_dir import run_folder_of
    from coupled_qk.training.run_folder import RunFolder

    folder = tmp_path_factory.mktemp("f")
    for entry in entries:
        (folder / entry).parent.mkdir(parents=True, exist_ok=True)
        (folder / entry).write_text("x")
    expected = folder.absolute() if RunFolder(folder).is_run() else None
    assert run_folder_of(folder / "report.json") == expected and run_folder_of(folder) == expected, sorted(entries)

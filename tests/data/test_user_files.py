"""Files users bring: corpora in other encodings or formats, tokenizer files, GLUE tables, the cache variable."""

from __future__ import annotations

import gzip
import json

import pytest

from coupled_qk.data.corpora import load_corpus
from tests.conftest import make_text

# ---------------------------------------------------------------- corpus files


def test_utf8_byte_order_mark_is_not_text(tmp_path):
    text = make_text(40, 0)
    (tmp_path / "plain.txt").write_text(text, encoding="utf-8")
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbf" + text.encode())
    plain, bom = (load_corpus(str(tmp_path / f), min_split_words=0) for f in ("plain.txt", "bom.txt"))
    for split in ("train", "valid", "test"):
        assert "\ufeff" not in bom.split(split)
        assert bom.split(split) == plain.split(split)


def test_given_split_with_byte_order_mark(tmp_path):
    for split, seed in (("train", 0), ("valid", 1), ("test", 2)):
        (tmp_path / f"{split}.txt").write_bytes(b"\xef\xbb\xbf" + make_text(5, seed).encode())
    corpus = load_corpus(str(tmp_path))
    assert corpus.valid == make_text(5, 1)


@pytest.mark.parametrize(
    "encode, what",
    [
        (lambda t: t.encode("utf-16"), "UTF-16 text"),
        (lambda t: t.encode("utf-32"), "UTF-32 text"),
        (lambda t: gzip.compress(t.encode()), "gzip-compressed"),
    ],
)
def test_not_utf8_files_are_named(tmp_path, encode, what):
    (tmp_path / "c.txt").write_bytes(encode(make_text(40, 0)))
    with pytest.raises(ValueError, match=f"c.txt is not valid UTF-8 text .*it is (a |an )?{what}") as info:
        load_corpus(str(tmp_path / "c.txt"))
    assert "expected UTF-8 text" in str(info.value)


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".ndjson"])
def test_json_lines_refused_not_trained_as_text(tmp_path, suffix):
    lines = [json.dumps({"text": d}) for d in make_text(40, 0).split("\n\n")]
    (tmp_path / f"c{suffix}").write_text("\n\n".join(lines))
    with pytest.raises(ValueError, match=rf"c\{suffix} is a \{suffix} file; a corpus is plain UTF-8 text"):
        load_corpus(str(tmp_path / f"c{suffix}"))


# ---------------------------------------------------------------- tokenizer specs


@pytest.mark.parametrize("spec", ["bpe-0", "bpe-100", "bpe-99999999", "bpe-x", "bpe-", "bpe-8k"])
def test_bad_bpe_spec_named_before_any_training(spec):
    from coupled_qk.data.tokenizers import check_tokenizer_spec, get_tokenizer

    with pytest.raises(ValueError, match=rf"--tokenizer='{spec}': a trained BPE is 'bpe-<N>' with N an integer"):
        check_tokenizer_spec("--tokenizer", spec)
    with pytest.raises(ValueError, match=rf"tokenizer='{spec}': a trained BPE"):
        get_tokenizer(spec, train_text="some text " * 100)


def test_tokenizer_folders(tmp_path, data_dir):
    from coupled_qk.data.tokenizers import check_tokenizer_spec, get_tokenizer, gpt2_tokenizer

    gpt2_files = data_dir / "tokenizer" / "gpt2"  # vocab.json + merges.txt, no tokenizer.json
    assert get_tokenizer(str(gpt2_files)).fingerprint == gpt2_tokenizer(data_dir).fingerprint
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "vocab.json").write_bytes((gpt2_files / "vocab.json").read_bytes())
    with pytest.raises(ValueError, match="'.*half': the folder holds vocab.json but not merges.txt"):
        get_tokenizer(str(tmp_path / "half"))
    (tmp_path / "none").mkdir()
    with pytest.raises(ValueError, match="--tokenizer='.*none': the folder holds no tokenizer.json"):
        check_tokenizer_spec("--tokenizer", str(tmp_path / "none"))


def test_train_refuses_a_bad_tokenizer_before_reading_the_corpus(tmp_path, capsys):
    from coupled_qk.cli import main

    missing = tmp_path / "no-such-corpus.txt"  # the corpus is never read: the tokenizer is named first
    args = [
        "train",
        "--corpus",
        str(missing),
        "--tokenizer",
        "bpe-100",
        "--max-steps",
        "2",
        "--out-dir",
        str(tmp_path / "run"),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--no-progress",
    ]
    assert main(args) == 2
    assert "--tokenizer='bpe-100': a trained BPE" in capsys.readouterr().err
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


# ---------------------------------------------------------------- the cache variable


@pytest.mark.parametrize("where", ["file", "file/sub"])
def test_cache_variable_naming_a_file(tmp_path, monkeypatch, where):
    from coupled_qk.data.paths import default_cache_dir

    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("COUPLED_QK_CACHE", str(tmp_path / where))
    with pytest.raises(
        ValueError,
        match=r"COUPLED_QK_CACHE='.*file(/sub)?'.*(is a file; expected a folder|is a "
        "file, so nothing can be created under it)",
    ):
        default_cache_dir()
    monkeypatch.setenv("COUPLED_QK_CACHE", str(tmp_path / "cache"))
    assert default_cache_dir() == tmp_path / "cache"


def test_train_names_the_cache_variable(tmp_path, monkeypatch, capsys):
    from coupled_qk.cli import main
    from tests.conftest import write_corpus

    corpus = write_corpus(tmp_path / "corpus")
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("COUPLED_QK_CACHE", str(tmp_path / "file"))
    args = [
        "train",
        "--corpus",
        str(corpus),
        "--tokenizer",
        "bpe-300",
        "--max-steps",
        "2",
        "--no-progress",
        "--out-dir",
        str(tmp_path / "run"),
    ]
    assert main(args) == 2
    assert "COUPLED_QK_CACHE=" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # refused before the run folder is claimed


# ---------------------------------------------------------------- GLUE tables

RTE_ROWS = [("A man sleeps.", "Someone sleeps.", 0), ("A dog runs.", "A cat flies.", 1), ("It rains.", "It is wet.", 0)]


def _tsv(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join("\t".join(map(str, r)) + "\n" for r in rows))


def test_glue_file_without_header_refused_not_one_row_short(tmp_path):
    from coupled_qk.data.glue import load_glue

    _tsv(tmp_path / "RTE" / "train.tsv", [(a, b, y, i) for i, (a, b, y) in enumerate(RTE_ROWS)])
    with pytest.raises(
        ValueError,
        match=r"RTE/train.tsv: the first row \['A man sleeps.', .*\] is not a header "
        r"naming the columns \['sentence1', 'sentence2', 'label'\]",
    ):
        load_glue("rte", "train", tmp_path)
    _tsv(tmp_path / "SST-2" / "train.tsv", [("good", 1), ("bad", 0)])
    with pytest.raises(ValueError, match=r"SST-2/train.tsv: the first row \['good', '1'\] is not a header"):
        load_glue("sst2", "train", tmp_path)


def test_glue_columns_found_by_name(tmp_path):
    """GLUE's own RTE layout (index, sentence1, sentence2, label as entailment / not_entailment) was read by
    position: the index as the first sentence and the second sentence as the label."""
    from coupled_qk.data.glue import load_glue

    names = {0: "entailment", 1: "not_entailment"}
    _tsv(
        tmp_path / "RTE" / "train.tsv",
        [("index", "sentence1", "sentence2", "label")] + [(i, a, b, names[y]) for i, (a, b, y) in enumerate(RTE_ROWS)],
    )
    split = load_glue("rte", "train", tmp_path)
    assert split.texts_a == [a for a, _, _ in RTE_ROWS] and split.texts_b == [b for _, b, _ in RTE_ROWS]
    assert split.labels.tolist() == [y for _, _, y in RTE_ROWS]
    _tsv(tmp_path / "SST-2" / "train.tsv", [("id", "label", "sentence"), (7, 1, "good"), (8, 0, "bad")])
    split = load_glue("sst2", "train", tmp_path)
    assert split.texts_a == ["good", "bad"] and split.labels.tolist() == [1, 0]


def test_glue_empty_sentence_and_empty_dev(tmp_path):
    from coupled_qk.data.glue import load_glue

    _tsv(tmp_path / "SST-2" / "train.tsv", [("sentence", "label"), ("good", 1), (" ", 0)])
    with pytest.raises(ValueError, match="SST-2/train.tsv row 3: the sentence is empty"):
        load_glue("sst2", "train", tmp_path)
    _tsv(tmp_path / "SST-2" / "dev.tsv", [("sentence", "label")])
    with pytest.raises(ValueError, match="SST-2/dev.tsv has no labelled rows; expected at least one example"):
        load_glue("sst2", "dev", tmp_path)


# ---------------------------------------------------------------- folders


def test_hidden_copies_are_not_read(tmp_path):
    """A notebook's checkpoint copy of a file was read as more documents: its documents landed in other splits
    than the originals (test text trained on)."""
    text = make_text(60, 0)
    (tmp_path / "notes.txt").write_text(text)
    (tmp_path / ".ipynb_checkpoints").mkdir()
    (tmp_path / ".ipynb_checkpoints" / "notes-checkpoint.txt").write_text(text)
    with pytest.warns(UserWarning, match=r"1 hidden \*.txt file\(s\) .* left out \(.ipynb_checkpoints/notes-"):
        corpus = load_corpus(str(tmp_path), min_split_words=0)
    assert corpus.source["files"] == [str(tmp_path / "notes.txt")]
    alone = load_corpus(str(tmp_path / "notes.txt"), min_split_words=0)
    assert all(corpus.split(s) == alone.split(s) for s in ("train", "valid", "test"))


def test_files_beside_given_splits_are_named(tmp_path):
    from tests.conftest import write_corpus

    folder = write_corpus(tmp_path / "c")
    (folder / "more_train.txt").write_text(make_text(50, 3))
    with pytest.warns(
        UserWarning,
        match=r"holds the splits train.txt, valid.txt, test.txt, so only those are "
        r"read; more_train.txt left out",
    ):
        corpus = load_corpus(str(folder))
    assert corpus.train == make_text(300, 0)


@pytest.mark.parametrize(
    "content, found",
    [
        ("", r"has no text \(only whitespace\);"),
        (" \n\t\n\n", r"has no text \(only whitespace\);"),
        ("one line " * 1000, "has 1 document;"),
    ],
)
def test_corpus_without_documents_says_why(tmp_path, content, found):
    (tmp_path / "c.txt").write_text(content)
    with pytest.raises(
        ValueError, match=f"corpus '.*c.txt' {found} need at least 3 documents .*separated by blank lines"
    ):
        load_corpus(str(tmp_path / "c.txt"))


def test_lm_eval_task_files_with_byte_order_mark(tmp_path):
    """make-task's readers kept the mark: the first document began with U+FEFF and an SST-2 file's header row was
    taken for an example ('\\ufeffsentence<TAB>label' is no header), refused as a malformed line."""
    from coupled_qk.hf.harness import make_task, text_documents

    (tmp_path / "t.txt").write_bytes(b"\xef\xbb\xbffirst\n\nsecond\n")
    assert text_documents(tmp_path / "t.txt") == ["first", "second"]
    (tmp_path / "s.tsv").write_bytes(b"\xef\xbb\xbfsentence\tlabel\ngood\t1\nbad\t0\n")
    yaml = make_task("sst2", tmp_path / "s.tsv", tmp_path / "tasks")
    rows = [json.loads(line) for line in yaml.with_suffix(".jsonl").read_text().splitlines()]
    assert rows == [{"sentence": "good", "label": 1}, {"sentence": "bad", "label": 0}]


def test_glue_cola_in_glue_layout(tmp_path, data_dir):
    """GLUE's own CoLA copy (CoLA/train.tsv, dev.tsv; no raw/) was refused asking for raw/in_domain_train.tsv."""
    from coupled_qk.data.glue import load_glue

    raw = data_dir / "glue" / "CoLA" / "raw"
    (tmp_path / "CoLA").mkdir()
    (tmp_path / "CoLA" / "train.tsv").write_bytes((raw / "in_domain_train.tsv").read_bytes())
    (tmp_path / "CoLA" / "dev.tsv").write_bytes(
        (raw / "in_domain_dev.tsv").read_bytes() + (raw / "out_of_domain_dev.tsv").read_bytes()
    )
    for split in ("train", "dev"):
        mine, theirs = load_glue("cola", split, tmp_path), load_glue("cola", split, data_dir / "glue")
        assert mine.texts_a == theirs.texts_a and mine.labels.tolist() == theirs.labels.tolist()


# ---------------------------------------------------------------- a run's recorded corpus


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from coupled_qk.cli import main
    from tests.conftest import write_corpus

    root = tmp_path_factory.mktemp("run")
    corpus = write_corpus(root / "corpus")
    args = [
        "train",
        "--corpus",
        str(corpus),
        "--tokenizer",
        "bpe-300",
        "--cache-dir",
        str(root / "cache"),
        "--set",
        "n_layer=1",
        "--set",
        "d_model=32",
        "--set",
        "n_heads=2",
        "--set",
        "block_size=16",
        "--batch-size",
        "4",
        "--warmup-steps",
        "1",
        "--max-steps",
        "2",
        "--no-progress",
        "--no-tensorboard",
        "--out-dir",
        str(root / "run"),
    ]
    assert main(args) == 0
    return root


@pytest.mark.parametrize("command", ["eval", "analyze"])
def test_missing_recorded_corpus_names_the_run_config(tiny_run, tmp_path, capsys, command):
    """eval/analyze of a run whose corpus moved said 'unknown corpus ...', an option the user never passed."""
    from coupled_qk.cli import main

    moved = tiny_run / "corpus-moved"
    (tiny_run / "corpus").rename(moved)
    try:
        extra = ["--out-dir", str(tmp_path / "analysis")] if command == "analyze" else []
        assert main([command, str(tiny_run / "run"), *extra]) == 2
        err = capsys.readouterr().err
        assert f"the corpus recorded in {tiny_run / 'run' / 'config.json'} cannot be read: unknown corpus" in err
        assert "pass --corpus (and --data-dir)" in err
    finally:
        moved.rename(tiny_run / "corpus")
    assert main(["eval", str(tiny_run / "run"), "--splits", "valid"]) == 0


def test_glue_command_reads_every_file_before_creating_folders(tiny_run, tmp_path, capsys):
    """An empty dev.tsv was found after the study folder and its model/task folders were created."""
    from coupled_qk.cli import main

    rows = [("sentence1", "sentence2", "label", "idx")] + [(a, b, y, i) for i, (a, b, y) in enumerate(RTE_ROWS)]
    _tsv(tmp_path / "glue" / "RTE" / "train.tsv", rows)
    _tsv(tmp_path / "glue" / "RTE" / "dev.tsv", rows[:1])
    out = tmp_path / "study"
    assert (
        main(
            [
                "glue",
                str(tiny_run / "run"),
                "--task",
                "rte",
                "--glue-dir",
                str(tmp_path / "glue"),
                "--epochs",
                "1",
                "--out-dir",
                str(out),
                "--no-progress",
            ]
        )
        == 2
    )
    assert "RTE/dev.tsv has no labelled rows" in capsys.readouterr().err
    assert not out.exists()


def test_compare_reads_the_corpus_before_creating_folders(tmp_path, capsys):
    """A UTF-16 corpus failed in the first run, after compare had created out/standard/."""
    from coupled_qk.cli import main

    (tmp_path / "c.txt").write_bytes(make_text(40, 0).encode("utf-16"))
    out = tmp_path / "cmp"
    assert (
        main(
            [
                "compare",
                "--corpus",
                str(tmp_path / "c.txt"),
                "--tokenizer",
                "bpe-300",
                "--max-steps",
                "2",
                "--variants",
                "standard,coupled",
                "--out-dir",
                str(out),
                "--no-progress",
            ]
        )
        == 2
    )
    assert "is not valid UTF-8 text" in capsys.readouterr().err
    assert not out.exists()


def test_broken_links_and_folders_named_txt(tmp_path):
    """A broken link was 'expected file ... does not exist; pass --data-dir ...' (a given split: 'not test.txt',
    though it is there); a folder named notes.txt inside a corpus folder was read as a missing file."""
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text(make_text(60, 0))
    (folder / "old.txt").mkdir()
    assert load_corpus(str(folder), min_split_words=0).source["files"] == [str(folder / "a.txt")]
    (folder / "b.txt").symlink_to(tmp_path / "nowhere.txt")
    with pytest.raises(
        FileNotFoundError,
        match=r"b.txt is a broken symbolic link \(to .*nowhere.txt\); expected a "
        "text file$",
    ):
        load_corpus(str(folder))
    from tests.conftest import write_corpus

    given = write_corpus(tmp_path / "given")
    (given / "test.txt").unlink()
    (given / "test.txt").symlink_to(tmp_path / "gone.txt")
    with pytest.raises(FileNotFoundError, match=r"given/test.txt is a broken symbolic link"):
        load_corpus(str(given))


# ---------------------------------------------------------------- saved run configs


def test_saved_config_without_a_field_compares_as_its_default():
    """A run's config.json without a field (saved before the field existed, or trimmed by hand) was compared as
    None: --resume refused 'weight_decay: None vs 0.1' and compare refused to reuse the finished run, though
    check_saved_config reads a missing field as its default."""
    from coupled_qk.study.executor import setting_differences
    from coupled_qk.training.config import TrainConfig, config_differences

    cfg = TrainConfig(corpus="pubmed", max_steps=5)
    saved = cfg.to_dict()
    for name in ("weight_decay", "best_mode", "model", "min_delta"):
        del saved[name]
    assert config_differences(saved, cfg) == {}
    assert setting_differences(saved, cfg) == {}
    saved["lr"] = 0.5  # a real difference is still one
    assert config_differences(saved, cfg) == {"lr": (0.5, 0.001)}
    assert setting_differences(saved, cfg) == {"lr": (0.5, 0.001)}


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.update(tokens="x"), 'tokens="x" is a string; expected an object'),
        (lambda d: d["tokens"].update(valid="12"), 'tokens.valid="12" is a string; expected an integer'),
        (lambda d: d["text_sha256"].update(valid=None), "text_sha256.valid=null is null; expected a string"),
        (lambda d: d.update(vocab_size="300"), 'vocab_size="300" is a string; expected an integer'),
    ],
)
def test_hand_edited_data_json_is_named_not_reported_as_changed_data(tiny_run, tmp_path, edit, message):
    """A data.json value of the wrong kind was reported as changed data ('vocab_size: 300 recorded, 300 now')."""
    import shutil

    from coupled_qk.training.config import TrainConfig
    from coupled_qk.training.run_folder import RunFolder
    from coupled_qk.training.tasks.lm import LMTask, split_changes

    run = tmp_path / "run"
    shutil.copytree(tiny_run / "run", run)
    data = json.loads((run / "data.json").read_text())
    edit(data)
    (run / "data.json").write_text(json.dumps(data))
    saved = json.loads((run / "config.json").read_text())
    cfg = TrainConfig.from_dict({**saved, "out_dir": str(run), "resume": True})
    task = LMTask(cfg, run)
    with pytest.raises(ValueError, match=f"{run / 'data.json'}: {message} \\(was the file edited by hand\\?\\)"):
        RunFolder(run).check_data(task)
    if not message.startswith("vocab_size"):  # eval compares the splits only
        with pytest.raises(ValueError, match=message):
            split_changes(RunFolder(run), task.corpus, ("valid",), {"valid": len(task.tokens["valid"])})


def test_bpe_spec_trains_even_beside_a_folder_of_that_name(tmp_path, monkeypatch):
    """'bpe-<N>' keeps meaning a BPE to train (as the LM task reads it) where the current folder holds bpe-<N>/."""
    from coupled_qk.data.tokenizers import get_tokenizer

    monkeypatch.chdir(tmp_path)
    (tmp_path / "bpe-300").mkdir()
    tok = get_tokenizer("bpe-300", train_text=make_text(200, 0))
    assert tok.name.startswith("bpe-") and tok.vocab_size <= 300

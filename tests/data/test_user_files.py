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


@pytest.mark.parametrize("encode, what", [
    (lambda t: t.encode("utf-16"), "UTF-16 text"),
    (lambda t: t.encode("utf-32"), "UTF-32 text"),
    (lambda t: gzip.compress(t.encode()), "gzip-compressed"),
])
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
    args = ["train", "--corpus", str(missing), "--tokenizer", "bpe-100", "--max-steps", "2",
            "--out-dir", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache"), "--no-progress"]
    assert main(args) == 2
    assert "--tokenizer='bpe-100': a trained BPE" in capsys.readouterr().err
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


# ---------------------------------------------------------------- the cache variable


@pytest.mark.parametrize("where", ["file", "file/sub"])
def test_cache_variable_naming_a_file(tmp_path, monkeypatch, where):
    from coupled_qk.data.paths import default_cache_dir

    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("COUPLED_QK_CACHE", str(tmp_path / where))
    with pytest.raises(ValueError, match=r"COUPLED_QK_CACHE='.*file(/sub)?'.*(is a file; expected a folder|is a "
                       "file, so nothing can be created under it)"):
        default_cache_dir()
    monkeypatch.setenv("COUPLED_QK_CACHE", str(tmp_path / "cache"))
    assert default_cache_dir() == tmp_path / "cache"


def test_train_names_the_cache_variable(tmp_path, monkeypatch, capsys):
    from coupled_qk.cli import main
    from tests.conftest import write_corpus

    corpus = write_corpus(tmp_path / "corpus")
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("COUPLED_QK_CACHE", str(tmp_path / "file"))
    args = ["train", "--corpus", str(corpus), "--tokenizer", "bpe-300", "--max-steps", "2", "--no-progress",
            "--out-dir", str(tmp_path / "run")]
    assert main(args) == 2
    assert "COUPLED_QK_CACHE=" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # refused before the run folder is claimed

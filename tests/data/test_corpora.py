"""Corpus loading: data-dir resolution, the shared corpora, user layouts and error messages."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from coupled_qk.data import paths
from coupled_qk.data.corpora import (
    KNOWN_CORPORA,
    detokenize_wikitext,
    load_corpus,
    random_split,
    split_documents,
    word_count,
)


def _docs(text: str) -> list[str]:
    return text.rstrip("\n").split("\n\n")


# ---------------------------------------------------------------- paths


def test_data_dir_env_and_errors(monkeypatch, tmp_path):
    monkeypatch.setenv("COUPLED_QK_DATA", str(tmp_path))
    assert paths.default_data_dir() == tmp_path.resolve()
    monkeypatch.setenv("COUPLED_QK_DATA", str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="COUPLED_QK_DATA"):
        paths.default_data_dir()


def test_data_dir_fallbacks(monkeypatch, tmp_path):
    monkeypatch.delenv("COUPLED_QK_DATA", raising=False)
    monkeypatch.setattr(paths, "_repo_root", lambda: tmp_path / "elsewhere" / "repo")
    (tmp_path / "work").mkdir()
    (tmp_path / "elsewhere" / "repo").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "work")
    with pytest.raises(FileNotFoundError) as e:
        paths.default_data_dir()
    msg = str(e.value)
    assert "COUPLED_QK_DATA" in msg and str(tmp_path / "shared" / "data") in msg
    assert str(tmp_path / "elsewhere" / "shared" / "data") in msg
    (tmp_path / "elsewhere" / "shared" / "data").mkdir(parents=True)  # repo-relative candidate
    assert paths.default_data_dir() == (tmp_path / "elsewhere" / "shared" / "data").resolve()
    (tmp_path / "shared" / "data").mkdir(parents=True)  # cwd-relative candidate wins
    assert paths.default_data_dir() == (tmp_path / "shared" / "data").resolve()


def test_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("COUPLED_QK_CACHE", str(tmp_path / "c"))
    assert paths.default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("COUPLED_QK_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert paths.default_cache_dir() == tmp_path / ".cache" / "coupled_qk"


# ---------------------------------------------------------------- shared corpora


def test_wiki_vital(data_dir):
    c = load_corpus("wiki-vital", data_dir)
    assert c.train == (data_dir / "wiki-vital" / "train.txt").read_text(encoding="utf-8")
    assert c.valid == detokenize_wikitext((data_dir / "wikitext-2" / "valid.txt").read_text(encoding="utf-8"))
    assert c.test.startswith("\n= Robert <unk> =\n")
    assert len(c.train) == 5_099_193 and c.source["split"] == "given"
    assert c.split("valid") is c.valid and "5,099,193 chars" in repr(c)
    with pytest.raises(ValueError, match="split='dev'"):
        c.split("dev")


def test_wikitext2_word_counts(data_dir):
    # Merity et al. (2016), Table 1: WikiText-2 valid / test tokens, one <eos> per line
    valid = (data_dir / "wikitext-2" / "valid.txt").read_text(encoding="utf-8")
    test = (data_dir / "wikitext-2" / "test.txt").read_text(encoding="utf-8")
    assert word_count(valid, add_eos=True) == 217_646 and word_count(test, add_eos=True) == 245_569
    assert word_count(valid) == 213_886
    assert word_count(" a  b\tc\n d") == 4 and word_count("a\nb", add_eos=True) == 4
    with pytest.raises(TypeError, match="text must be str"):
        word_count(b"a b")


def test_pubmed_split_is_deterministic_and_partitions(data_dir):
    a = load_corpus("pubmed", data_dir)
    b = load_corpus("pubmed", data_dir)
    assert (a.train, a.valid, a.test) == (b.train, b.valid, b.test)
    assert a.source["n_documents"] == {"train": 5510, "valid": 56, "test": 56}
    original = split_documents((data_dir / "pubmed" / "abstracts.txt").read_text(encoding="utf-8"))
    assert len(original) == 5622
    got = _docs(a.train) + _docs(a.valid) + _docs(a.test)
    assert Counter(got) == Counter(original)
    c = load_corpus("pubmed", data_dir, seed=1)
    assert c.valid != a.valid and len(_docs(c.valid)) == 56
    d = load_corpus("pubmed", data_dir, valid_fraction=0.05, test_fraction=0.1)
    assert d.source["n_documents"] == {"train": 4779, "valid": 281, "test": 562}


@pytest.mark.slow
def test_mixed_domain(data_dir):
    c = load_corpus("mixed-domain", data_dir)
    names = [Path(f).name for f in c.source["files"]]
    assert names == ["agnews.txt", "bible.txt", "brown.txt", "jargon.txt", "web_sentences.txt"]
    assert c.source["n_documents"] == {"train": 28568, "valid": 292, "test": 292}
    per_file = {n: split_documents((data_dir / "mixed-domain" / n).read_text(encoding="utf-8")) for n in names}
    # agnews.txt has no blank line: 17,602 lines -> 881 documents of 20 lines (the last one shorter)
    assert len(per_file["agnews.txt"]) == 881
    assert {d.count("\n") + 1 for d in per_file["agnews.txt"][:-1]} == {20}
    origin = {d: n for n, docs in per_file.items() for d in docs}
    got = _docs(c.train) + _docs(c.valid) + _docs(c.test)
    assert Counter(got) == Counter(d for docs in per_file.values() for d in docs)
    # mixed at document level: the first 200 training documents already come from every file
    assert set(origin[d] for d in _docs(c.train)[:200]) == set(names)
    assert 26_000_000 < len(c.train) < 27_000_000 and 250_000 < len(c.valid) < 400_000


# ---------------------------------------------------------------- document rule and split


def test_split_documents_rule():
    text = "a\nb\n \t\nc\n\n\n  d  \n"
    assert split_documents(text) == ["a\nb", "c", "  d  "]
    long = "\n".join(f"l{i}" for i in range(250))
    groups = split_documents(long + "\n\nshort")
    assert [g.count("\n") + 1 for g in groups] == [20] * 12 + [10, 1]
    assert groups[0].startswith("l0\n") and groups[12].endswith("l249")
    assert len(split_documents("\n".join("x" * 100))) == 1  # exactly max_lines stays whole
    assert split_documents("a\r\nb\r\n\r\nc") == ["a\r\nb\r", "c"]


def test_random_split_validation():
    docs = [f"d{i}" for i in range(10)]
    train, valid, test = random_split(docs, 0, 0.01, 0.01, "x", min_split_words=0)
    assert (len(train), len(valid), len(test)) == (8, 1, 1)
    assert sorted(train + valid + test) == sorted(docs)
    with pytest.raises(ValueError, match="valid_fraction=1.5"):
        random_split(docs, 0, 1.5, 0.1, "x")
    with pytest.raises(ValueError, match="must be < 1"):
        random_split(docs, 0, 0.5, 0.5, "x")
    with pytest.raises(ValueError, match="seed='0'"):
        random_split(docs, "0", 0.1, 0.1, "x")
    with pytest.raises(ValueError, match="has 2 documents"):
        random_split(docs[:2], 0, 0.1, 0.1, "x")


# ---------------------------------------------------------------- user layouts


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("name,ext", [("wikitext-103", "tokens"), ("wikitext-2-raw", "raw")])
def test_wikitext_release_layout(tmp_path, name, ext):
    for s in ("train", "valid", "test"):
        _write(tmp_path / name / f"wiki.{s}.{ext}", f" = {s} = \n")
    for root in (tmp_path, tmp_path / name):  # parent folder or the folder itself
        c = load_corpus(name, root)
        assert (c.train, c.valid, c.test) == (" = train = \n", " = valid = \n", " = test = \n")
    other = "wikitext-2" if name == "wikitext-103" else "wikitext-103-raw"
    with pytest.raises(FileNotFoundError) as e:
        load_corpus(other, tmp_path)
    msg = str(e.value)
    assert str(tmp_path / other / "wiki.train.") in msg and "--data-dir" in msg and "COUPLED_QK_DATA" in msg


def test_path_inputs(tmp_path):
    f = _write(tmp_path / "one.txt", "\n\n".join(f"doc {i}\nline" for i in range(100)))
    c = load_corpus(str(f), min_split_words=0)
    assert c.source["n_documents"] == {"train": 98, "valid": 1, "test": 1} and c.name == str(f)
    c = load_corpus(str(f))  # 300 words: each evaluation split grows to its cap, 20% of the words
    assert c.source["n_documents"] == {"train": 60, "valid": 20, "test": 20}
    folder = tmp_path / "many"
    _write(folder / "b.txt", "\n\n".join(f"b{i}" for i in range(50)))
    _write(folder / "sub" / "a.txt", "\n\n".join(f"a{i}" for i in range(50)))
    c = load_corpus(str(folder))
    assert [Path(p).name for p in c.source["files"]] == ["b.txt", "a.txt"]  # sorted by relative path
    assert sorted(_docs(c.train) + _docs(c.valid) + _docs(c.test)) == sorted(
        [f"a{i}" for i in range(50)] + [f"b{i}" for i in range(50)]
    )
    given = tmp_path / "given"
    for s in ("train", "valid", "test"):
        _write(given / f"{s}.txt", f"{s} text\n")
    c = load_corpus(str(given))
    assert c.valid == "valid text\n" and c.source["split"] == "given"
    (given / "test.txt").unlink()
    with pytest.raises(FileNotFoundError, match="test.txt"):
        load_corpus(str(given))


def test_relative_path_resolved_in_data_dir(data_dir):
    c = load_corpus("mixed-domain/jargon.txt", data_dir)
    assert c.source["path"] == str(data_dir / "mixed-domain" / "jargon.txt")


# ---------------------------------------------------------------- errors


def test_unknown_name_lists_known(tmp_path):
    with pytest.raises(ValueError) as e:
        load_corpus("wikitext-42", tmp_path)
    assert all(k in str(e.value) for k in KNOWN_CORPORA)


@pytest.mark.parametrize("name", ["", " ", "\t\n"])
def test_empty_corpus_name_is_refused_not_read_as_the_current_folder(tmp_path, monkeypatch, name):
    """Path('') is '.': an empty --corpus used to read every *.txt below the current folder as the corpus
    (``analyze --corpus ''``, ``train --corpus ''``)."""
    from coupled_qk.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("\n\n".join(f"document {i} with a few words" for i in range(40)))
    with pytest.raises(ValueError, match=r"corpus .* is empty \(--corpus\); expected a corpus name"):
        load_corpus(name)
    assert main(["train", "--corpus", name, "--out-dir", str(tmp_path / "run"), "--max-steps", "1"]) == 2
    assert not (tmp_path / "run").exists()  # analyze: tests/analysis/test_analyze.py::test_analyze_command


def test_missing_file_message(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        load_corpus("pubmed", tmp_path)
    msg = str(e.value)
    assert "'pubmed'" in msg and str(tmp_path / "pubmed" / "abstracts.txt") in msg
    assert "--data-dir" in msg and "COUPLED_QK_DATA" in msg


def test_non_utf8_and_empty_split(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\n\n\xff\xfe broken\n")
    with pytest.raises(ValueError, match=r"bad\.txt is not valid UTF-8.*offset 6"):
        load_corpus(str(bad))
    for s, text in (("train", "x\n"), ("valid", " \n\n"), ("test", "y\n")):
        _write(tmp_path / "d" / f"{s}.txt", text)
    with pytest.raises(ValueError, match="the valid split is empty"):
        load_corpus(str(tmp_path / "d"))
    with pytest.raises(ValueError, match="test_fraction=0"):
        load_corpus(str(tmp_path / "d" / "train.txt"), test_fraction=0)


def test_detokenize_wikitext_by_hand():
    text = ' = Title = \n \n A 1 @,@ 000 @-@ year ( old ) test , it \'s " fine " : yes . \n'
    assert detokenize_wikitext(text) == '= Title =\n\nA 1,000-year (old) test, it\'s "fine": yes.\n'


def test_wiki_vital_evaluates_on_detokenized_wikitext_with_original_word_counts(data_dir):
    corpus = load_corpus("wiki-vital", data_dir)
    assert " @-@ " not in corpus.valid and " , " not in corpus.test
    # Merity et al. (2016) WikiText-2 counts (words + one <eos> per line) of the original text
    assert corpus.words("valid") == 217_646 and corpus.words("test") == 245_569


def test_unreadable_file_names_the_file(tmp_path, monkeypatch):
    from pathlib import Path

    path = tmp_path / "locked.txt"
    path.write_text("some text\n\nmore text\n")

    def denied(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(OSError, match=r"cannot read .*locked\.txt"):
        load_corpus(str(path))


def test_random_split_reaches_min_words_within_cap():
    from coupled_qk.data.corpora import random_split

    docs = [" ".join([f"w{i}"] * 100) for i in range(200)]  # 20,000 words, no document a copy of another
    train, valid, test = random_split(docs, 0, 0.01, 0.01, "x", min_split_words=1_000)
    assert (len(test), len(valid), len(train)) == (10, 10, 180)  # 2 docs by fraction, grown to 1,000 words
    train, valid, test = random_split(docs, 0, 0.01, 0.01, "x", min_split_words=10_000)
    assert (len(test), len(valid)) == (40, 40)  # capped at 20% of the 20,000 words each
    train, valid, test = random_split(docs, 0, 0.01, 0.01, "x", min_split_words=0)
    assert (len(test), len(valid)) == (2, 2)  # the fractions alone
    with pytest.raises(ValueError, match="min_split_words=-1"):
        random_split(docs, 0, 0.01, 0.01, "x", min_split_words=-1)

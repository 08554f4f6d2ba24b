"""Corpus text is checked for its content, not only its encoding (docs/RELIABILITY.md, "Data"): every file corpus
reads through ``data/corpora.py::read_text``, so each rule holds for a text file, a folder of ``*.txt`` files and
given splits alike.

- line-break conventions (``\\r\\n``, ``\\r``; U+2028/U+2029/NEL in a file without ``\\n``) are normalised to
  ``\\n`` with a warning naming the file: the splits equal those of the same text written with ``\\n``;
- C0 control characters and DEL are refused naming the file, line and column;
- a path that is not a regular file (pipe, socket, device, link loop) is named for what it is;
- nothing beside a folder corpus's files is left out silently;
- documents repeated across splits: a random split keeps copies together, given splits sharing one are warned;
- text already in ``\\n`` form is read unchanged (the shared corpora keep their fingerprints).
"""

from __future__ import annotations

import hashlib
import os
import socket
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coupled_qk.data.corpora import CONTROL_CHARACTERS, load_corpus, read_text
from coupled_qk.data.documents import MIN_REPEAT_WORDS, random_split, split_documents
from tests.conftest import WORDS, make_text

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

DOCUMENTS = st.lists(
    st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=8).map(" ".join), min_size=1, max_size=4),
    min_size=8,
    max_size=20,
)
"""Documents as lists of lines (each a few words)."""

CONVENTIONS = {  # name -> (line break, paragraph break): how a file of documents is written
    "lf": ("\n", "\n\n"),
    "crlf": ("\r\n", "\r\n\r\n"),
    "cr": ("\r", "\r\r"),
    "line and paragraph separators": ("\u2028", "\u2029"),
    "nel": ("\x85", "\x85\x85"),
}


def _write(path: Path, docs: list[list[str]], convention: str) -> Path:
    line, paragraph = CONVENTIONS[convention]
    path.write_bytes((paragraph.join(line.join(doc) for doc in docs) + line).encode("utf-8"))
    return path


def _splits(corpus) -> tuple[str, str, str]:
    return corpus.train, corpus.valid, corpus.test


@SETTINGS
@given(docs=DOCUMENTS, convention=st.sampled_from(sorted(CONVENTIONS)))
def test_every_line_break_convention_gives_the_splits_of_the_same_text_with_lf(tmp_path_factory, docs, convention):
    root = tmp_path_factory.mktemp("c")
    plain = _write(root / "lf.txt", docs, "lf")
    other = _write(root / "other.txt", docs, convention)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = load_corpus(str(other), min_split_words=0)
        expected = load_corpus(str(plain), min_split_words=0)  # generated documents may repeat: a notice each
    notices = [str(w.message) for w in caught if str(other) in str(w.message) and "read with" in str(w.message)]
    assert (len(notices) == 1) == (convention != "lf"), notices
    assert _splits(got) == _splits(expected)
    assert not any("\r" in s or "\u2028" in s or "\x85" in s for s in _splits(got))


@SETTINGS
@given(
    code=st.sampled_from(sorted({chr(c) for c in [*range(0, 32), 127]} - {"\t", "\n", "\r", "\x0b", "\x0c"})),
    where=st.integers(0, 10_000),
)
def test_a_control_character_is_refused_naming_the_file_line_and_column(tmp_path_factory, code, where):
    text = make_text(40, 0)
    where %= len(text)
    path = tmp_path_factory.mktemp("c") / "c.txt"
    path.write_text(text[:where] + code + text[where:])
    line = text.count("\n", 0, where) + 1
    column = where - (text.rfind("\n", 0, where) + 1) + 1
    with pytest.raises(ValueError, match=f"{path} line {line}, column {column} holds the control character") as exc:
        load_corpus(str(path), min_split_words=0)
    assert f"U+{ord(code):04X}" in str(exc.value)
    assert CONTROL_CHARACTERS.fullmatch(code)


@pytest.mark.parametrize("kept", ["\t", "\x0b", "\x0c", "\x85", "\x96", "\u2028", "\u2029", "\u200b", "\ufffd"])
def test_whitespace_and_c1_characters_inside_lines_are_kept(tmp_path, kept):
    """What the shared corpora hold (C1 characters from Windows-1252 text in ``mixed-domain``, one U+2029 in
    ``pubmed``) is text inside lines: kept byte for byte."""
    text = make_text(40, 0).replace(" the ", f" the{kept}", 3)
    (tmp_path / "c.txt").write_text(text)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_text(tmp_path / "c.txt", "c") == text


def _fifo(path: Path) -> str:
    os.mkfifo(path)
    return "a named pipe"


def _socket(path: Path) -> str:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()
    return "a socket"


def _device(path: Path) -> str:
    path.symlink_to("/dev/null")
    return "a character device"


def _loop(path: Path) -> str:
    path.symlink_to(path.with_name("other.txt"))
    path.with_name("other.txt").symlink_to(path)
    return "a loop of symbolic links"


NOT_REGULAR = {"fifo": _fifo, "socket": _socket, "device": _device, "link loop": _loop}


@pytest.mark.parametrize("kind", sorted(NOT_REGULAR))
@pytest.mark.parametrize("layout", ["file", "folder", "given split"])
@pytest.mark.filterwarnings("ignore:.*so only those are read:UserWarning")  # a link loop's second name, beside
def test_a_path_that_is_not_a_regular_file_is_named_for_what_it_is(tmp_path, kind, layout):
    """A named pipe was 'does not exist' (and reading one blocks for ever), as were sockets, devices and link
    loops; in a folder corpus or as a given split alike."""
    folder = tmp_path / "c"
    folder.mkdir()
    if layout == "given split":
        for split in ("train", "valid"):
            (folder / f"{split}.txt").write_text(make_text(20, 0))
    elif layout == "folder":
        (folder / "a.txt").write_text(make_text(40, 0))
    target = folder / ("test.txt" if layout == "given split" else "b.txt")
    what = NOT_REGULAR[kind](target)
    with pytest.raises(ValueError, match=f"{target} is {what}"):
        load_corpus(str(target if layout == "file" else folder), min_split_words=0)


def test_nothing_beside_a_folder_corpus_is_left_out_silently(tmp_path):
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text(make_text(60, 0))
    (folder / "README.md").write_text("about")
    (folder / "sub" / "b.TXT").write_text(make_text(5, 1))
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "c.txt").write_text(make_text(5, 2))
    (folder / "linked").symlink_to(tmp_path / "elsewhere")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        corpus = load_corpus(str(folder), min_split_words=0)
    said = " | ".join(str(w.message) for w in caught)
    assert "2 file(s) not named *.txt under" in said and "README.md" in said and "sub/b.TXT" in said, said
    assert "symbolic link(s) to folders" in said and "linked" in said, said
    assert corpus.source["files"] == [str(folder / "a.txt")]


def test_everything_beside_given_splits_is_named_except_a_derived_folders_stamp(tmp_path):
    """A study's derived split folder (``claims-data/wiki-vital-quarter``) was warned about for its own
    ``source.txt``; a user's folder beside given splits is named, as are other files."""
    from coupled_qk.data.splits import document_split

    data = tmp_path / "data"
    (data / "pubmed").mkdir(parents=True)
    (data / "pubmed" / "abstracts.txt").write_text(make_text(400, 0))
    derived = document_split(data, tmp_path / "cache", "small", source="pubmed", valid_docs=20, test_docs=40)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_corpus(str(derived))
    (derived / "extra").mkdir()
    (derived / "notes.md").write_text("mine")
    (derived / "source.txt").write_text("my own source notes\n")  # a user's file of that name is named
    with pytest.warns(UserWarning, match=r"extra/, notes.md, source.txt left out"):
        load_corpus(str(derived))


def _old_random_split(docs, seed, vf, tf, min_words):
    """The document split before copies were kept together (an independent reference for corpora without
    copies: the committed studies' splits)."""
    n = len(docs)
    n_test, n_valid = max(1, round(n * tf)), max(1, round(n * vf))
    order = sorted(range(n), key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).digest())
    words = [len(docs[i].split()) for i in order]
    cap = 0.2 * sum(words)

    def take(start, n_min, reserve):
        end, have = start + n_min, sum(words[start : start + n_min])
        while have < min_words and end < n - reserve and have + words[end] <= cap:
            have += words[end]
            end += 1
        return end

    t = take(0, n_test, n_valid + 1)
    v = take(t, n_valid, 1)
    return [docs[i] for i in order[v:]], [docs[i] for i in order[t:v]], [docs[i] for i in order[:t]]


LONG_DOCS = st.lists(
    st.lists(st.sampled_from(WORDS), min_size=MIN_REPEAT_WORDS, max_size=MIN_REPEAT_WORDS + 10).map(" ".join),
    min_size=6,
    max_size=30,
    unique=True,
)


@SETTINGS
@given(
    docs=LONG_DOCS,
    copies=st.lists(st.integers(0, 1000), max_size=10),
    seed=st.integers(0, 2**32 - 1),
    min_words=st.sampled_from([0, 50, 10_000]),
)
def test_a_random_split_keeps_copies_of_a_document_in_one_split(docs, copies, seed, min_words):
    """With copies, no held-out document (of at least MIN_REPEAT_WORDS words) is also a training document;
    without, the split is the one the committed studies used, document for document."""
    corpus = docs + [docs[c % len(docs)] for c in copies]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train, valid, test = random_split(corpus, seed, 0.1, 0.1, "c", min_words)
    assert sorted(train + valid + test) == sorted(corpus)
    assert not set(train) & (set(valid) | set(test))
    if not copies:
        assert (train, valid, test) == _old_random_split(corpus, seed, 0.1, 0.1, min_words)
        assert not caught
    else:
        assert any("repeat an earlier one" in str(w.message) for w in caught)


def test_given_splits_sharing_documents_are_named_with_the_file_and_line(tmp_path):
    shared = " ".join(WORDS[: MIN_REPEAT_WORDS + 5])
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "train.txt").write_text(make_text(50, 0) + "\n" + shared + "\n")
    (folder / "valid.txt").write_text(make_text(10, 1))
    test = make_text(10, 2) + "\n" + shared + "\n"
    (folder / "test.txt").write_text(test)
    line = test[: test.index(shared)].count("\n") + 1
    with pytest.warns(UserWarning, match=rf"1 document\(s\) of its test split .* train split; the first at "
                      rf"{folder / 'test.txt'} line {line}"):  # fmt: skip
        load_corpus(str(folder))


SHARED = Path(os.environ.get("COUPLED_QK_DATA", Path(__file__).parents[3] / "shared" / "data"))


@pytest.mark.skipif(not (SHARED / "pubmed").is_dir(), reason="the shared corpora are not here")
def test_the_shared_corpora_are_read_unchanged_and_without_a_notice():
    """Every shared corpus file in ``\\n`` form is read byte for byte (the committed records' fingerprints and
    cached token arrays stay valid), and loading the corpora says nothing."""
    for path in sorted(SHARED.rglob("*.txt")):
        if "glue" not in path.parts:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                assert read_text(path, "shared") == path.read_bytes().decode("utf-8"), path
    docs = split_documents(read_text(SHARED / "pubmed" / "abstracts.txt", "pubmed"))
    assert random_split(docs, 0, 0.01, 0.01, "pubmed") == _old_random_split(docs, 0, 0.01, 0.01, 10_000)

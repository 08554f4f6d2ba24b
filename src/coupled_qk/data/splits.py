"""Document splits the studies train on, written as corpus folders with given splits.

``wiki-vital`` trains on Wikipedia lead sections and validates on WikiText-2, which is a different
distribution (other articles, tokenized text with ``<unk>``). The studies also need a held-out split of the
*training* distribution (``docs/METHOD.md`` section 5): :func:`heldout_corpus` splits ``wiki-vital/train.txt`` by
article (a level-1 WikiText heading `` = Title = `` starts an article, so no article contributes paragraphs to
both sides), and :func:`document_split` makes a training subset with an enlarged test split (wiki-vital articles
or PubMed abstracts). Both write ``train.txt`` / ``valid.txt`` / ``test.txt`` into a folder that
:func:`coupled_qk.data.corpora.load_corpus` reads as a corpus with given splits.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from coupled_qk.checks.values import finite, nonneg_int
from coupled_qk.data.corpora import SPLIT_STAMP, random_split, read_text
from coupled_qk.files import write_text_atomic

_ARTICLE = re.compile(r"^ = [^=].* = $", re.M)
HELDOUT_NAME = "wiki-vital-heldout"
"""Corpus folder name (relative to the run's ``data_dir``) of :func:`heldout_corpus`."""


def split_articles(text: str) -> list[str]:
    """Articles of a WikiText-layout text: each starts at a `` = Title = `` line (level-1 heading).

    Text before the first heading is its own article. Returns non-empty strings, whitespace-stripped at the
    ends, in order.

    Raises:
        ValueError: ``text`` holds no level-1 heading (not WikiText layout).
    """
    starts = [m.start() for m in _ARTICLE.finditer(text)]
    if not starts:
        raise ValueError("text holds no ' = Title = ' heading line; expected WikiText layout")
    bounds = ([0] if starts[0] > 0 else []) + starts + [len(text)]
    pieces = (text[a:b].strip("\n") for a, b in zip(bounds, bounds[1:]))
    return [p for p in pieces if p.strip()]


def _articles_of(text: str, path: Path) -> list[str]:
    """:func:`split_articles` of the file ``path``'s ``text``; its ``ValueError`` names the file."""
    try:
        return split_articles(text)
    except ValueError as exc:
        raise ValueError(f"corpus 'wiki-vital': {path}: {exc}") from None


def heldout_corpus(data_dir: str | Path, out_root: str | Path, seed: int = 0, fraction: float = 0.02) -> Path:
    """Write (once) the article-level split of ``<data_dir>/wiki-vital/train.txt`` and return its folder.

    ``valid`` and ``test`` each take ``fraction`` of the articles (chosen by
    :func:`coupled_qk.data.corpora.random_split` with ``seed``), ``train`` the rest; articles are joined by a
    blank line. The folder is ``<out_root>/wiki-vital-heldout`` and holds ``source.txt`` with the input's
    sha256 and the split settings; an existing folder made from other input or settings is rewritten.

    Raises:
        FileNotFoundError: ``wiki-vital/train.txt`` is missing under ``data_dir``.
        ValueError: bad ``seed``/``fraction``.
    """
    nonneg_int("seed", seed)
    finite("fraction", fraction, 0, 0.5, lo_open=True, hi_open=True)
    src = Path(data_dir) / "wiki-vital" / "train.txt"
    text = read_text(src, "wiki-vital")
    stamp = f"sha256={hashlib.sha256(text.encode()).hexdigest()} seed={seed} fraction={fraction} unit=article\n"
    out = Path(out_root) / HELDOUT_NAME
    if (out / SPLIT_STAMP).is_file() and (out / SPLIT_STAMP).read_text() == stamp:
        return out
    # min_split_words=0: exactly round(n * fraction) articles per split (the split the committed runs used)
    train, valid, test = random_split(
        _articles_of(text, src), seed, fraction, fraction, "wiki-vital", min_split_words=0
    )
    out.mkdir(parents=True, exist_ok=True)
    for name, docs in (("train", train), ("valid", valid), ("test", test)):
        write_text_atomic(out / f"{name}.txt", "\n\n".join(docs) + "\n")
    write_text_atomic(out / SPLIT_STAMP, stamp)
    return out


SPLIT_SOURCES = ("wiki-vital", "pubmed")


def _documents(data_dir: Path, source: str) -> list[str]:
    """The documents of a released corpus: wiki-vital articles (:func:`split_articles`), PubMed abstracts
    (one per paragraph)."""
    if source == "wiki-vital":
        path = data_dir / "wiki-vital" / "train.txt"
        return _articles_of(read_text(path, "wiki-vital"), path)
    text = read_text(data_dir / "pubmed" / "abstracts.txt", "pubmed")
    return [d.strip() for d in re.split(r"\n\s*\n", text) if d.strip()]


def document_split(
    data_dir: str | Path,
    out_root: str | Path,
    name: str,
    source: str = "wiki-vital",
    seed: int = 0,
    valid_docs: int = 200,
    test_docs: int = 1000,
    train_fraction: float = 0.25,
) -> Path:
    """Write (once) a document-level split with a training *subset* and an enlarged test split; return its folder.

    For studies run to a plateau: the documents of ``source``
    (``wiki-vital`` articles or ``pubmed`` abstracts) are put in the order ``sha256(f"{seed}:{i}")``;
    ``valid`` takes the first ``valid_docs``, ``test`` the next ``test_docs``, and ``train`` the first
    ``round(train_fraction * rest)`` documents of the rest, so the test split can be far larger than a
    fraction of a small corpus (unused documents, never trained on) and paired evaluation noise falls well
    below the effect under test. Written to ``<out_root>/<name>/{train,valid,test}.txt`` with ``source.txt``
    stamping the input's sha256 and the settings; a folder made from other input or settings is rewritten.

    Raises:
        ValueError: unknown ``source``, a bad name, count or fraction, or fewer documents than the splits need.
        FileNotFoundError: the source corpus is missing under ``data_dir``.
    """
    from coupled_qk.checks.values import choice, positive_int

    choice("source", source, SPLIT_SOURCES)
    for arg, value in (("data_dir", data_dir), ("out_root", out_root)):
        if not isinstance(value, (str, Path)) or str(value) == "":
            raise ValueError(f"{arg}={value!r}; expected a folder path")
    nonneg_int("seed", seed)
    positive_int("valid_docs", valid_docs)
    positive_int("test_docs", test_docs)
    finite("train_fraction", train_fraction, 0, 1, lo_open=True)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or name in (".", ".."):
        # "." and ".." match the pattern but name out_root itself or its parent: the split would land outside
        raise ValueError(f"name={name!r} must be a folder-safe name ([A-Za-z0-9_.-]+, not '.' or '..')")
    docs = _documents(Path(data_dir), source)
    rest = len(docs) - valid_docs - test_docs
    n_train = round(train_fraction * rest)
    if rest < 1 or n_train < 1:
        raise ValueError(
            f"{source} has {len(docs)} documents: too few for valid_docs={valid_docs}, "
            f"test_docs={test_docs} and a training fraction {train_fraction} of the rest"
        )
    digest = hashlib.sha256("\n\n".join(docs).encode()).hexdigest()
    stamp = (
        f"source={source} sha256={digest} seed={seed} valid_docs={valid_docs} test_docs={test_docs} "
        f"train_fraction={train_fraction} unit=document\n"
    )
    out = Path(out_root) / name
    if (out / SPLIT_STAMP).is_file() and (out / SPLIT_STAMP).read_text() == stamp:
        return out
    order = sorted(range(len(docs)), key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).digest())
    valid = [docs[i] for i in order[:valid_docs]]
    test = [docs[i] for i in order[valid_docs : valid_docs + test_docs]]
    train = [docs[i] for i in order[valid_docs + test_docs :][:n_train]]
    out.mkdir(parents=True, exist_ok=True)
    for split, chosen in (("train", train), ("valid", valid), ("test", test)):
        write_text_atomic(out / f"{split}.txt", "\n\n".join(chosen) + "\n")
    write_text_atomic(out / SPLIT_STAMP, stamp)
    return out

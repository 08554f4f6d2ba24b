"""Documents and splits: the :class:`Corpus` value, document splitting, the deterministic document-level random
split and the joining conventions shared by every corpus source (:mod:`coupled_qk.data.corpora` for files,
:mod:`coupled_qk.data.hub` for Hugging Face datasets).

Documents (:func:`split_documents`): runs of non-blank lines separated by blank (whitespace-only) lines. A
paragraph longer than ``MAX_DOC_LINES`` = 100 lines is cut into consecutive groups of ``GROUP_LINES`` = 20
lines. Random splits (:func:`random_split`) shuffle documents by ``sha256(f"{seed}:{index}")`` (independent of
Python/NumPy versions); each split's documents are joined with a blank line (:func:`join_documents`).
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass, field

from coupled_qk.checks.values import nonneg_int

SPLITS = ("train", "valid", "test")
MAX_DOC_LINES = 100
GROUP_LINES = 20
MIN_SPLIT_WORDS = 10_000  # words each random evaluation split aims for (~13k GPT-2 tokens)
MAX_EVAL_SHARE = 0.2  # ... but never more than this share of the corpus's words
MIN_REPEAT_WORDS = 20
"""A document of at least this many words that occurs twice is one document repeated (a copied paragraph): its
copies are kept in one split by :func:`random_split`, and given splits sharing one are warned about
(:func:`check_repeats`). Shorter ones (a heading, "See also", a one-line record) repeat by nature."""


@dataclass
class Corpus:
    """A corpus as three text splits.

    Attributes:
        name: corpus name or the path it was loaded from.
        train, valid, test: the split texts (``str``, unicode, exactly as read / joined; never empty).
        source: provenance: files read, data dir, split method, seed, fractions, document counts.
        word_counts: per split, the word count of the *original* text where the text was transformed
            (``wiki-vital``'s detokenized WikiText-2 splits), for word-level perplexity.
    """

    name: str
    train: str = field(repr=False)
    valid: str = field(repr=False)
    test: str = field(repr=False)
    source: dict = field(default_factory=dict)
    word_counts: dict = field(default_factory=dict)

    def words(self, split: str) -> int:
        """Words of ``split`` in WikiText's convention (whitespace words plus one ``<eos>`` per line) of the
        original text: the normaliser of word-level perplexity."""
        return self.word_counts.get(split) or word_count(self.split(split), add_eos=True)

    def split(self, split: str) -> str:
        """The text of ``split`` (one of ``"train"``, ``"valid"``, ``"test"``); ValueError otherwise."""
        if split not in SPLITS:
            raise ValueError(f"split={split!r} is not one of {SPLITS}")
        return getattr(self, split)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{s}={len(getattr(self, s)):,} chars" for s in SPLITS)
        return f"Corpus(name={self.name!r}, {sizes})"


def word_count(text: str, *, add_eos: bool = False) -> int:
    """Number of whitespace-separated words in ``text`` (``len(text.split())``).

    This is the normaliser for word-level perplexity on WikiText: ``ppl_word = exp(total_nll / words)``
    with the NLL summed over all subword tokens. ``add_eos=True`` also counts one ``<eos>`` per line (every
    ``"\\n"``, plus an unterminated last line), the convention of Merity et al. (2016): it gives their
    WikiText-2 counts, 217,646 (valid) and 245,569 (test) tokens.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    n = len(text.split())
    if add_eos:
        n += text.count("\n") + (1 if text and not text.endswith("\n") else 0)
    return n


def split_documents(text: str, max_lines: int = MAX_DOC_LINES, group_lines: int = GROUP_LINES) -> list[str]:
    """Split ``text`` into documents: blank-line-separated paragraphs, long ones cut into line groups.

    Returns:
        Non-empty documents, in order, each a ``"\\n"``-joined run of non-blank lines (lines are split at
        ``"\\n"`` only; other whitespace, including ``"\\r"``, is kept). A paragraph of more than
        ``max_lines`` lines becomes consecutive groups of ``group_lines`` lines.
    """
    if max_lines < 1 or group_lines < 1:
        raise ValueError(f"max_lines={max_lines} and group_lines={group_lines} must both be >= 1")
    docs: list[str] = []
    para: list[str] = []

    def flush() -> None:
        if len(para) > max_lines:
            docs.extend("\n".join(para[i : i + group_lines]) for i in range(0, len(para), group_lines))
        elif para:
            docs.append("\n".join(para))
        para.clear()

    for line in text.split("\n"):
        if line.strip():
            para.append(line)
        else:
            flush()
    flush()
    return docs


def check_fraction(name: str, value: float) -> float:
    """``value`` as a float; ``ValueError`` naming ``name`` unless it is a number strictly between 0 and 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ValueError(f"{name}={value!r} must be a number strictly between 0 and 1")
    return float(value)


def random_split(
    docs: list[str],
    seed: int,
    valid_fraction: float,
    test_fraction: float,
    corpus: str,
    min_split_words: int = MIN_SPLIT_WORDS,
) -> tuple[list[str], list[str], list[str]]:
    """Deterministic document-level split into (train, valid, test) lists, in shuffled order.

    The order is ``sorted(range(n), key=sha256(f"{seed}:{i}"))``, where a document repeating an earlier one word
    for word (at least :data:`MIN_REPEAT_WORDS` words) takes its first copy's ``i``, so that all copies land in
    one split (a warning says so; a corpus without such copies splits as before). Test takes the first documents
    of that order, valid the next ones, train the rest. Each evaluation split takes at least
    ``max(1, round(n * fraction))`` documents and keeps adding documents until it holds ``min_split_words``
    whitespace-separated words (about 1.3 GPT-2 tokens each), but never more than
    ``MAX_EVAL_SHARE`` = 20% of the corpus's words, so small corpora still train on most of their text (their
    evaluation splits are then smaller than ``min_split_words``, and the training task warns).

    Raises:
        ValueError: bad seed / fractions / minimum, or fewer documents than needed for one per split.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed={seed!r} must be an int")
    valid_fraction = check_fraction("valid_fraction", valid_fraction)
    test_fraction = check_fraction("test_fraction", test_fraction)
    nonneg_int("min_split_words", min_split_words)
    if valid_fraction + test_fraction >= 1:
        raise ValueError(f"valid_fraction + test_fraction = {valid_fraction + test_fraction} must be < 1")
    n = len(docs)
    n_test, n_valid = max(1, round(n * test_fraction)), max(1, round(n * valid_fraction))
    if n - n_test - n_valid < 1:
        found = "no text (only whitespace)" if n == 0 else f"{n} document{'s' if n > 1 else ''}"
        raise ValueError(
            f"corpus {corpus!r} has {found}; need at least {n_test + n_valid + 1} documents for "
            "non-empty train/valid/test splits (documents are separated by blank lines; or give a "
            "folder with train.txt, valid.txt and test.txt)"
        )
    first = _first_copies(docs)
    # copies of a document share their first copy's place in the order (ties: by index), so one split holds them all
    order = sorted(range(n), key=lambda i: (hashlib.sha256(f"{seed}:{first[i]}".encode()).digest(), i))
    words = [len(docs[i].split()) for i in order]
    cap = MAX_EVAL_SHARE * sum(words)

    def group_end(end: int, limit: int) -> int:  # past the copies of the document just taken
        while 0 < end < limit and first[order[end]] == first[order[end - 1]]:
            end += 1
        return end

    def take(start: int, n_min: int, reserve: int) -> int:  # end index of a split starting at ``start``
        end = group_end(start + n_min, n - reserve)
        have = sum(words[start:end])
        while have < min_split_words and end < n - reserve:
            after = group_end(end + 1, n - reserve)  # a document with its copies
            if have + sum(words[end:after]) > cap:
                break
            have += sum(words[end:after])
            end = after
        return end

    test_end = take(0, n_test, n_valid + 1)
    valid_end = take(test_end, n_valid, 1)
    test = [docs[i] for i in order[:test_end]]
    valid = [docs[i] for i in order[test_end:valid_end]]
    train = [docs[i] for i in order[valid_end:]]
    repeated = n - len(set(first))
    if repeated:
        warnings.warn(
            f"corpus {corpus!r}: {repeated} document(s) of at least {MIN_REPEAT_WORDS} words repeat an earlier one "
            "word for word; each one's copies are kept in one split, so no held-out document is also trained on "
            "(remove the copies to weigh each document once)",
            UserWarning,
            stacklevel=3,
        )
    check_repeats(corpus, {"train": train, "valid": valid, "test": test})  # copies cut apart at a split's edge
    return train, valid, test


def _first_copies(docs: list[str]) -> list[int]:
    """For each document, the index of its first copy when it has at least :data:`MIN_REPEAT_WORDS` words and
    repeats an earlier one exactly; its own index otherwise."""
    seen: dict[str, int] = {}
    return [seen.setdefault(d, i) if len(d.split()) >= MIN_REPEAT_WORDS else i for i, d in enumerate(docs)]


def check_repeats(corpus: str, docs: dict[str, list[str]], files: dict | None = None, texts: dict | None = None) -> int:
    """Warn when documents of the ``valid`` or ``test`` split (of at least :data:`MIN_REPEAT_WORDS` words) occur
    word for word in the ``train`` split: the held-out perplexity is then measured partly on trained text. The
    warning names how many, their share of the split's words, and the first one's line in its file (``files``:
    split -> path, where known). Returns the number found.

    Args:
        corpus: the corpus name, for the message.
        docs: split -> its documents (:func:`split_documents`).
        files, texts: split -> the file it was read from and its text (given splits), for the message's line.
    """
    trained = {d for d in docs["train"] if len(d.split()) >= MIN_REPEAT_WORDS}
    found = 0
    for split in ("valid", "test"):
        repeats = [d for d in docs[split] if d in trained]
        if not repeats:
            continue
        found += len(repeats)
        share = sum(len(d.split()) for d in repeats) / max(1, sum(len(d.split()) for d in docs[split]))
        where = ""
        if files and texts and split in files:
            line = texts[split].count("\n", 0, max(0, texts[split].find(repeats[0]))) + 1
            where = f"; the first at {files[split]} line {line}"
        warnings.warn(
            f"corpus {corpus!r}: {len(repeats)} document(s) of its {split} split ({share:.1%} of its words) also "
            f"appear word for word in its train split{where}: the {split} perplexity is measured partly on text the "
            "model trained on; remove them from one of the splits",
            UserWarning,
            stacklevel=3,
        )
    return found


def join_documents(docs: list[str]) -> str:
    """The documents joined with a blank line (``"\\n\\n"``) plus a final newline; ``""`` for none."""
    return "\n\n".join(docs) + "\n" if docs else ""


def finish_corpus(name: str, train: str, valid: str, test: str, source: dict) -> Corpus:
    """The :class:`Corpus` of three split texts; ``ValueError`` naming the corpus and split when one is empty.
    Given splits (``source["split"] == "given"``) that share documents are warned about (:func:`check_repeats`;
    a random split keeps copies together itself)."""
    for split, text in zip(SPLITS, (train, valid, test)):
        if not text.strip():
            raise ValueError(f"corpus {name!r}: the {split} split is empty (source: {source.get('files')})")
    if source.get("split") == "given":
        files = source.get("files") if isinstance(source.get("files"), dict) else None
        docs = {split: split_documents(text) for split, text in zip(SPLITS, (train, valid, test))}
        check_repeats(name, docs, files, dict(zip(SPLITS, (train, valid, test))))
    return Corpus(name, train, valid, test, source)

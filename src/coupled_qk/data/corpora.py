"""Real-text corpora as train / valid / test strings.

Sources (under the data dir, see :func:`coupled_qk.data.paths.default_data_dir` and its ``README.md``):

* ``wiki-vital``: train = ``wiki-vital/train.txt`` (lead sections of 10k Wikipedia vital articles in the
  WikiText layout); valid / test = ``wikitext-2/valid.txt`` / ``test.txt`` (the WikiText-2 = WikiText-103
  validation/test articles, tokenized release).
* ``pubmed``: ``pubmed/abstracts.txt``, one abstract per paragraph; document-level random split.
* ``mixed-domain``: every ``mixed-domain/*.txt`` (sorted), split into documents, mixed, then split.
* ``wikitext-103``, ``wikitext-2`` (+ ``-raw``): the official releases, ``wiki.{train,valid,test}.tokens``
  (``.raw`` for the raw variants) in the data dir or in its ``wikitext-103/`` ... sub-folder.
* ``hf:NAME[:CONFIG]``: a dataset loaded with Hugging Face ``datasets`` (optional; :mod:`coupled_qk.data.hub`).
* anything else is a path: a text file, a folder of ``*.txt`` files (recursive; hidden files
  and folders are not read), or a folder holding
  ``train.txt``/``valid.txt``/``test.txt`` or ``wiki.*.tokens`` (used as given).

Documents (:func:`split_documents`): runs of non-blank lines separated by blank (whitespace-only) lines. A
paragraph longer than ``MAX_DOC_LINES`` = 100 lines is cut into consecutive groups of ``GROUP_LINES`` = 20
lines: that handles line-per-record files (``agnews.txt`` has no blank line, ``web_sentences.txt`` one every
1,000 shuffled sentences) and a few long blocks of ``bible.txt``; Brown texts (<= 97 lines), Jargon File
entries and PubMed abstracts stay whole. Random splits shuffle documents by ``sha256(f"{seed}:{index}")``
(independent of Python/NumPy versions), take ``max(1, round(n * fraction))`` documents for test, then valid,
the rest for train, and join each split's documents with a blank line (``"\\n\\n"``, plus a final newline).
"""

from __future__ import annotations

import errno
import os
import re
import stat
import warnings
from pathlib import Path

from coupled_qk.data.documents import (
    GROUP_LINES,
    MAX_DOC_LINES,
    MAX_EVAL_SHARE,
    MIN_SPLIT_WORDS,
    SPLITS,
    Corpus,
    finish_corpus,
    join_documents,
    random_split,
    split_documents,
    word_count,
)
from coupled_qk.data.paths import DATA_ENV, default_data_dir

__all__ = [  # Corpus and the document conventions live in coupled_qk.data.documents; re-exported here
    "GROUP_LINES",
    "KNOWN_CORPORA",
    "MAX_DOC_LINES",
    "MAX_EVAL_SHARE",
    "MIN_SPLIT_WORDS",
    "SPLITS",
    "Corpus",
    "detokenize_wikitext",
    "load_corpus",
    "random_split",
    "read_text",
    "split_documents",
    "word_count",
]

KNOWN_CORPORA = (
    "wiki-vital",
    "pubmed",
    "mixed-domain",
    "wikitext-103",
    "wikitext-103-raw",
    "wikitext-2",
    "wikitext-2-raw",
)
_HINT = f"pass --data-dir (data_dir=) or set {DATA_ENV} to the folder holding it"


_WIKITEXT_RULES = [
    (re.compile(r" @(.)@ "), r"\1"),  # 1 @,@ 000 -> 1,000 ; state @-@ of -> state-of
    (re.compile(r" ([.,;:!?%)\]}])"), r"\1"),  # no space before closing punctuation
    (re.compile(r"([(\[{$]) "), r"\1"),  # no space after opening brackets and currency
    (re.compile(r" (n't|'s|'re|'ve|'m|'ll|'d)\b"), r"\1"),  # contractions and possessives
    (re.compile(r'" (.*?) "'), r'"\1"'),  # quotes hug what they quote
    (re.compile(r"^ ", re.M), ""),  # WikiText starts every line with a space
    (re.compile(r" $", re.M), ""),
    (re.compile(r"^(=+) (.*?) (=+)$", re.M), r"\1 \2 \3"),  # headings keep their form
]


def detokenize_wikitext(text: str) -> str:
    """Undo WikiText's tokenization so the text reads like plain Wikipedia: ``"1 @,@ 000"`` -> ``"1,000"``,
    ``"word , word"`` -> ``"word, word"``, ``"( x )"`` -> ``"(x)"``, ``"it 's"`` -> ``"it's"``.

    ``<unk>`` markers stay. Word-level perplexity must still be normalised by the word count of the original
    (tokenized) text, as in Radford et al. (2019), who evaluated GPT-2 on detokenized WikiText.
    """
    for pattern, repl in _WIKITEXT_RULES:
        text = pattern.sub(repl, text)
    return text


_NOT_TEXT = (  # leading bytes of files that are not UTF-8 text -> what they are (checked in this order)
    (b"\x00\x00\xfe\xff", "UTF-32 text (big-endian byte order mark)"),
    (b"\xff\xfe\x00\x00", "UTF-32 text (little-endian byte order mark)"),
    (b"\xfe\xff", "UTF-16 text (big-endian byte order mark)"),
    (b"\xff\xfe", "UTF-16 text (little-endian byte order mark)"),
    (b"\x1f\x8b", "a gzip-compressed file"),
    (b"BZh", "a bzip2-compressed file"),
    (b"\xfd7zXZ\x00", "an xz-compressed file"),
    (b"\x28\xb5\x2f\xfd", "a zstd-compressed file"),
    (b"PK\x03\x04", "a zip archive"),
)
_JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")
UTF8_BOM = "\ufeff"


def read_text(path: Path, corpus: str) -> str:
    """Read ``path`` as strict UTF-8 (newlines kept exactly as stored; a leading UTF-8 byte order mark, which
    is not text, is dropped).

    Raises:
        FileNotFoundError: the file is missing or a broken symbolic link (message names the corpus and the file).
        ValueError: ``path`` is a folder; the file is not valid UTF-8 text (message names the file and the byte offset,
        and what the
            file is instead where its first bytes say: UTF-16/UTF-32 with a byte order mark, gzip/bzip2/xz/zstd
            or zip), or it is JSON (``.jsonl``/``.ndjson``/``.json``), whose syntax would be trained on as text.
        OSError: any other read failure, re-raised with the file named.
    """
    path = Path(path)
    if not path.is_file():
        _not_a_regular_file(path, corpus)
    if path.suffix.lower() in _JSON_SUFFIXES:
        raise ValueError(
            f"corpus {corpus!r}: {path} is a {path.suffix} file; a corpus is plain UTF-8 text, so its "
            "JSON syntax (keys, quotes, escapes) would be trained on as text; write the documents' "
            "text to a .txt file, one document per paragraph (blank line between)"
        )
    try:
        data = path.read_bytes()
    except OSError as e:
        raise OSError(f"corpus {corpus!r}: cannot read {path}: {e}") from e
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        kind = next((what for magic, what in _NOT_TEXT if data.startswith(magic)), None)
        found = f"; it is {kind}" if kind else ""
        encoding = kind.split()[0] if kind and kind.startswith("UTF") else "<its encoding>"
        fix = "decompress it" if kind and not kind.startswith("UTF") else f"convert it (iconv -f {encoding} -t UTF-8)"
        raise ValueError(
            f"corpus {corpus!r}: {path} is not valid UTF-8 text (bad byte at offset {e.start}"
            f"{found}); expected UTF-8 text: {fix}"
        ) from e
    return clean_text(text[1:] if text.startswith(UTF8_BOM) else text, path, corpus)


_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _not_a_regular_file(path: Path, corpus: str) -> None:
    """Raise the error naming what ``path`` (not a regular file) is: missing, a broken symbolic link or a link
    loop, a folder, a named pipe, a socket or a device (reading a pipe blocks, reading ``/dev/zero`` never ends:
    before, both were "does not exist").

    Raises:
        FileNotFoundError: missing, or a broken link. ValueError: anything else, naming it.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(f"corpus {corpus!r}: {path} is a loop of symbolic links; expected a text file") from None
        if path.is_symlink():
            raise FileNotFoundError(
                f"corpus {corpus!r}: {path} is a broken symbolic link (to {os.readlink(path)}); expected a text file"
            ) from None
        hint = f"; {_HINT}" if corpus in KNOWN_CORPORA else ""
        raise FileNotFoundError(f"corpus {corpus!r}: expected file {path} does not exist{hint}") from None
    if stat.S_ISDIR(mode):
        raise ValueError(f"corpus {corpus!r}: {path} is a folder; expected a text file")
    kind = next((what for test, what in _KINDS if test(mode)), "not a regular file")
    raise ValueError(f"corpus {corpus!r}: {path} is {kind}, not a regular file; expected a text file")


CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")
"""C0 control characters and DEL, which text does not hold (tab, line feed, carriage return, vertical tab and form
feed are whitespace and pass): a NUL, an ANSI escape (``ESC``) or a DOS end-of-file mark (``SUB``) would be
trained on as characters. C1 characters (U+0080-U+009F, usually Windows-1252 text read as Latin-1: the shared
``mixed-domain`` corpus holds some) are kept."""
_CONTROL_NAMES = {
    0x00: "NUL",
    0x08: "BS",
    0x1A: "SUB, a DOS end-of-file mark",
    0x1B: "ESC, an ANSI escape",
    0x7F: "DEL",
}
LINE_SEPARATORS = {"\u2028": "\n", "\u2029": "\n\n", "\x85": "\n"}
"""Unicode line and paragraph separators and NEL -> the line feeds they stand for, when they are a file's only
line breaks (a file that also has ``\n`` holds them as characters inside its lines, as the shared ``pubmed``
corpus does once)."""


def _line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def clean_text(text: str, path: Path | str, corpus: str) -> str:
    """A corpus file's decoded text with one line-break convention: ``\r\n`` (Windows) and a lone ``\r`` (old
    Mac OS) become ``\n``, as do U+2028 / U+0085 (U+2029, a paragraph separator: a blank line) in a file that has no
    ``\n``; each normalisation is a warning naming the file, the convention and its first line. Before, CRLF
    text was tokenized with its ``\r`` (other tokens than the same text with LF) and a CR-only file was one line.
    Text already in ``\n`` form is returned unchanged (the shared corpora: their fingerprints stay valid).

    Raises:
        ValueError: the text holds a C0 control character or DEL (:data:`CONTROL_CHARACTERS`), naming the file,
            the line and column of the first, the character and how many there are.
    """
    bad = CONTROL_CHARACTERS.search(text)
    if bad:
        code = ord(bad.group())
        line = _line_of(text, bad.start())
        column = bad.start() - (text.rfind("\n", 0, bad.start()) + 1) + 1
        count = len(CONTROL_CHARACTERS.findall(text))
        raise ValueError(
            f"corpus {corpus!r}: {path} line {line}, column {column} holds the control character U+{code:04X} "
            f"({_CONTROL_NAMES.get(code, 'not text')}; {count} in the file): it would be trained on as a character; "
            "remove control characters from the file (e.g. tr -d '\\000-\\010\\016-\\037\\177' < in > out)"
        )
    if "\r" in text:
        crlf = text.count("\r\n")
        lone = text.count("\r") - crlf
        first = _line_of(text, text.index("\r"))
        kinds = " and ".join(k for k, n in (("\\r\\n (Windows)", crlf), ("\\r (old Mac OS)", lone)) if n)
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        _notice(f"corpus {corpus!r}: {path} ends {crlf + lone:,} lines with {kinds} from line {first}: read with \\n")
    elif "\n" not in text and any(sep in text for sep in LINE_SEPARATORS):
        found = [f"U+{ord(sep):04X}" for sep in LINE_SEPARATORS if sep in text]
        for sep, breaks in LINE_SEPARATORS.items():
            text = text.replace(sep, breaks)
        _notice(
            f"corpus {corpus!r}: {path} separates its lines with {', '.join(found)} and has no \\n: read with \\n "
            "line breaks (a paragraph separator U+2029 as a blank line)"
        )
    return text


def _notice(message: str) -> None:
    warnings.warn(message, UserWarning, stacklevel=5)


def _words(docs: list[str]) -> int:
    return sum(len(d.split()) for d in docs)


def _from_documents(
    name: str, files: list[Path], seed: int, vf: float, tf: float, source: dict, min_words: int = MIN_SPLIT_WORDS
) -> Corpus:
    docs: list[str] = []
    for f in files:
        docs.extend(split_documents(read_text(f, name)))
    train, valid, test = random_split(docs, seed, vf, tf, name, min_words)
    source.update(
        files=[str(f) for f in files],
        split="document-level random",
        seed=seed,
        valid_fraction=vf,
        test_fraction=tf,
        min_split_words=min_words,
        max_doc_lines=MAX_DOC_LINES,
        group_lines=GROUP_LINES,
        n_documents={"train": len(train), "valid": len(valid), "test": len(test)},
        n_words={"train": _words(train), "valid": _words(valid), "test": _words(test)},
    )
    return finish_corpus(name, join_documents(train), join_documents(valid), join_documents(test), source)


def _from_given_splits(name: str, files: dict[str, Path], source: dict) -> Corpus:
    texts = {s: read_text(p, name) for s, p in files.items()}
    source.update(files={s: str(p) for s, p in files.items()}, split="given")
    return finish_corpus(name, texts["train"], texts["valid"], texts["test"], source)


def _wikitext(name: str, data_dir: Path) -> Corpus:
    ext = "raw" if name.endswith("-raw") else "tokens"
    candidates = [data_dir, data_dir / name]
    for folder in candidates:
        if (folder / f"wiki.train.{ext}").is_file():
            files = {s: folder / f"wiki.{s}.{ext}" for s in SPLITS}
            return _from_given_splits(name, files, {"data_dir": str(data_dir)})
    expected = " or ".join(str(c / f"wiki.train.{ext}") for c in candidates)
    raise FileNotFoundError(
        f"corpus {name!r}: expected file {expected} (data dir searched: {data_dir}); "
        f"download the official {name} release and {_HINT}"
    )


def _given_split_files(folder: Path) -> dict[str, Path] | None:
    for pattern in ("{}.txt", "wiki.{}.tokens", "wiki.{}.raw"):
        files = {s: folder / pattern.format(s) for s in SPLITS}
        present = [p for p in files.values() if p.exists() or p.is_symlink()]  # read_text names a link, pipe, ...
        if len(present) == 3:
            return files
        if present:
            missing = [str(p) for p in files.values() if p not in present]
            raise FileNotFoundError(
                f"{folder} holds {present[0].name} but not {', '.join(missing)}: a folder "
                "with given splits needs all of train/valid/test"
            )
    return None


def _text_files(name: str, folder: Path) -> list[Path]:
    """The ``*.txt`` files under ``folder`` (recursive, sorted by relative path), without hidden ones (a name
    starting with ``"."`` anywhere below ``folder``: editor and notebook copies such as
    ``.ipynb_checkpoints/notes-checkpoint.txt`` would put a second copy of a document into another split).
    Nothing is left out silently: a warning names the hidden ``*.txt`` files, the other files (``README.md``,
    ``notes.TXT``: only ``*.txt`` is read) and the symbolic links to folders (not followed)."""
    files, hidden, other, links = [], [], [], []
    for f in sorted(folder.rglob("*"), key=lambda p: p.relative_to(folder).as_posix()):
        rel = f.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts):
            if f.name.endswith(".txt") and not f.is_dir():
                hidden.append(f)
        elif f.is_symlink() and f.is_dir():  # rglob does not walk into it
            links.append(f)
        elif f.name.endswith(".txt") and not f.is_dir():  # a folder named *.txt: rglob walks into it anyway
            files.append(f)
        elif not f.is_dir():
            other.append(f)
    for found, what, why in (
        (hidden, "hidden *.txt file(s)", "hidden files and folders (names starting with '.') are not read"),
        (other, "file(s) not named *.txt", "only *.txt files are read"),
        (links, "symbolic link(s) to folders", "links to folders are not followed: link the files, or copy them in"),
    ):
        if found:
            shown = ", ".join(f.relative_to(folder).as_posix() for f in found[:3]) + (", ..." if len(found) > 3 else "")
            warnings.warn(
                f"corpus {name!r}: {len(found)} {what} under {folder} left out ({shown}); {why}",
                UserWarning,
                stacklevel=4,
            )
    return files


SPLIT_STAMP = "source.txt"
"""The file in which a split folder derived by coupled-qk (``experiments/claims/heldout.py``) records the input's
SHA-256 and the split settings: the project's own, not a split, never read as text nor warned about."""
_STAMP_TEXT = re.compile(r"(source=\S+ )?sha256=[0-9a-f]{64}( \w+=\S+)* unit=(article|document)\n")


def is_split_stamp(path: Path) -> bool:
    """Whether ``path`` is a derived split folder's :data:`SPLIT_STAMP` (its name and its one line of settings)."""
    try:
        return path.name == SPLIT_STAMP and path.stat().st_size < 4096 and bool(_STAMP_TEXT.fullmatch(path.read_text()))
    except (OSError, UnicodeDecodeError):
        return False


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:  # a loop of symbolic links
        return False


def _warn_unread(name: str, folder: Path, given: dict[str, Path]) -> None:
    """Warn about everything beside the given splits (files and folders, except hidden ones and a derived split
    folder's :data:`SPLIT_STAMP`), which a folder with given splits does not read."""
    unread = sorted(
        e.name + ("/" if _is_dir(e) else "")
        for e in os.scandir(folder)
        if not e.name.startswith(".") and Path(e.path) not in given.values() and not is_split_stamp(Path(e.path))
    )
    if unread:
        warnings.warn(
            f"corpus {name!r}: {folder} holds the splits {', '.join(p.name for p in given.values())}, so "
            f"only those are read; {', '.join(unread[:5])}{', ...' if len(unread) > 5 else ''} "
            "left out (move them into the splits, or elsewhere)",
            UserWarning,
            stacklevel=4,
        )


def _from_path(name: str, path: Path, seed: int, vf: float, tf: float, min_words: int) -> Corpus:
    source = {"path": str(path)}
    if not path.is_dir():  # a file, or what read_text names (a pipe, a socket, a device)
        return _from_documents(name, [path], seed, vf, tf, source, min_words)
    given = _given_split_files(path)
    if given is not None:
        _warn_unread(name, path, given)
        return _from_given_splits(name, given, source)
    files = _text_files(name, path)
    if not files:
        raise FileNotFoundError(f"corpus {name!r}: folder {path} holds no *.txt files (hidden ones are not read)")
    return _from_documents(name, files, seed, vf, tf, source, min_words)


SPLIT_OPTIONS = {
    "seed": ("split_seed", 0),
    "valid_fraction": ("valid_fraction", 0.01),
    "test_fraction": ("test_fraction", 0.01),
    "min_split_words": ("min_split_words", MIN_SPLIT_WORDS),
}
""":func:`load_corpus` argument -> (the run option that sets it: ``task_options.<name>``, ``--<name>``; its
default). They decide random splits only: a corpus with fixed splits (``source["split"] == "given"``) refuses
them at any other value (:func:`check_split_options`)."""


def check_split_options(corpus: Corpus, given: dict, unused: str = "refuse") -> None:
    """Refuse (``unused="refuse"``) or warn about (``"warn"``: a saved run read back as it ran) the first split
    option of ``given`` (:func:`load_corpus` argument -> value) at a non-default value when ``corpus`` has fixed
    splits, which it would silently ignore.

    Raises:
        ValueError: one line naming the option, its value, the corpus and why.
    """
    if corpus.source.get("split") != "given":
        return
    for arg, value in given.items():
        option, default = SPLIT_OPTIONS[arg]
        if value == default:
            continue
        message = (
            f"split option {option}={value} (--{option.replace('_', '-')}, task_options.{option}) does not "
            f"apply to corpus {corpus.name!r}: its train/valid/test splits are fixed (given by its files or "
            "dataset), so nothing is split at random; the split options are for corpora split at random "
            f"(pubmed, mixed-domain, a text file, a folder of *.txt files); leave {option} at its default "
            f"({default})"
        )
        if unused != "warn":
            raise ValueError(message)
        warnings.warn(f"{message} (a saved run's option; it had no effect)", UserWarning, stacklevel=3)
        return


def load_corpus(
    name_or_path: str,
    data_dir: str | Path | None = None,
    seed: int = 0,
    valid_fraction: float = 0.01,
    test_fraction: float = 0.01,
    min_split_words: int = MIN_SPLIT_WORDS,
    unused_split_options: str = "refuse",
) -> Corpus:
    """Load a corpus by name (:data:`KNOWN_CORPORA`) or path, as train/valid/test text.

    Args:
        name_or_path: a known corpus name, ``hf:NAME[:CONFIG]`` (Hugging Face ``datasets``), or a path (text file or
        folder; relative paths are tried
            against the current directory, then against the data dir). See the module docstring.
        data_dir: the data folder; default :func:`~coupled_qk.data.paths.default_data_dir`. For the
            ``wikitext-*`` names it may also be the folder holding ``wiki.*.tokens`` itself.
        seed: seed of the document-level split (int); the split is identical across runs and platforms.
        valid_fraction, test_fraction: fractions of documents (each in (0, 1), sum < 1) for random
            splits; at least one document goes to each split. Refused where splits are fixed (below).
        min_split_words: words each random evaluation split aims for (see :func:`random_split`).
        unused_split_options: ``"refuse"`` (default) or ``"warn"`` (a saved run read back as it ran): what a
            split option at a non-default value does for a corpus whose splits are fixed (the ``wikitext-*``
            releases, ``wiki-vital``, a folder of ``train/valid/test`` files, a hub dataset with all three
            splits), where it would be ignored (:func:`check_split_options`).

    Returns:
        A :class:`Corpus`.

    Raises:
        FileNotFoundError: a required file is missing (names corpus, file, data dir, ``--data-dir`` and
            ``COUPLED_QK_DATA``), or no data dir can be found.
        ValueError: an empty name; unknown name that is not an existing path (lists :data:`KNOWN_CORPORA`); a file that
        is
            not UTF-8; bad seed/fractions; an empty split; too few documents; a split option at a non-default
            value for a corpus with fixed splits (naming the option, the value and the corpus).
    """
    corpus = _load_corpus(name_or_path, data_dir, seed, valid_fraction, test_fraction, min_split_words)
    given = dict(seed=seed, valid_fraction=valid_fraction, test_fraction=test_fraction, min_split_words=min_split_words)
    check_split_options(corpus, given, unused_split_options)
    return corpus


def _load_corpus(
    name_or_path: str,
    data_dir: str | Path | None = None,
    seed: int = 0,
    valid_fraction: float = 0.01,
    test_fraction: float = 0.01,
    min_split_words: int = MIN_SPLIT_WORDS,
) -> Corpus:
    """:func:`load_corpus` without the check of the split options."""
    if not isinstance(name_or_path, (str, Path)):
        raise TypeError(f"name_or_path must be a str or Path, got {type(name_or_path).__name__}")
    name = str(name_or_path)
    if not name.strip():  # Path("") is the current folder: every *.txt below it would be read as the corpus
        raise ValueError(
            f"corpus {name!r} is empty (--corpus); expected a corpus name ({', '.join(KNOWN_CORPORA)}) "
            "or the path of a text file or folder ('.' for the current folder)"
        )
    if name.startswith("hf:"):  # Hugging Face datasets (optional; see coupled_qk.data.hub)
        from coupled_qk.data.hub import load_hub_corpus

        return load_hub_corpus(name, seed, valid_fraction, test_fraction, min_split_words=min_split_words)
    if name in KNOWN_CORPORA:
        root = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
        if not root.is_dir():
            raise FileNotFoundError(f"corpus {name!r}: data dir {root} does not exist; {_HINT}")
        if name.startswith("wikitext-"):
            return _wikitext(name, root)
        source = {"data_dir": str(root)}
        if name == "wiki-vital":
            files = {
                "train": root / "wiki-vital" / "train.txt",
                "valid": root / "wikitext-2" / "valid.txt",
                "test": root / "wikitext-2" / "test.txt",
            }
            corpus = _from_given_splits(name, files, source)
            # train is plain Wikipedia text; WikiText-2's splits are tokenized (" , ", " @-@ "): evaluate on
            # their detokenized form, keeping the original word counts for word-level perplexity
            for split in ("valid", "test"):
                corpus.word_counts[split] = word_count(corpus.split(split), add_eos=True)
                setattr(corpus, split, detokenize_wikitext(corpus.split(split)))
            corpus.source["valid_test"] = "WikiText-2, detokenized (coupled_qk.data.corpora.detokenize_wikitext)"
            return corpus
        if name == "pubmed":
            return _from_documents(
                name, [root / "pubmed" / "abstracts.txt"], seed, valid_fraction, test_fraction, source, min_split_words
            )
        folder = root / "mixed-domain"
        files = sorted(folder.glob("*.txt"))
        if not files:
            raise FileNotFoundError(
                f"corpus {name!r}: expected files {folder}/*.txt, found none (data dir searched: {root}); {_HINT}"
            )
        return _from_documents(name, files, seed, valid_fraction, test_fraction, source, min_split_words)
    path = Path(name).expanduser()
    if not path.exists() and not path.is_absolute():
        try:
            alt = (Path(data_dir).expanduser() if data_dir is not None else default_data_dir()) / path
        except FileNotFoundError:
            alt = path
        path = alt if alt.exists() else path
    if not path.exists():
        if path.is_symlink():  # a broken link or a loop of links: named as such
            _not_a_regular_file(path, name)
        raise ValueError(
            f"unknown corpus {name!r}: not one of {', '.join(KNOWN_CORPORA)} and not an existing file or folder"
        )
    return _from_path(name, path, seed, valid_fraction, test_fraction, min_split_words)

"""Tokenizers: GPT-2 byte-level BPE (offline, tiktoken-identical ids) and byte-level BPE trained here.

All tokenizers are Hugging Face ``tokenizers`` objects behind the small :class:`Tokenizer` wrapper. The
literal string ``<|endoftext|>`` in a text is encoded as the special token (like tiktoken's
``encode(text, allowed_special="all")``); everything else is plain byte-level BPE with the GPT-2 regex
``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+`` (no prefix space).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from coupled_qk.data.paths import DATA_ENV, default_data_dir
from coupled_qk.files import write_text_atomic
from coupled_qk.progress import progress_mode

EOT = "<|endoftext|>"
MIN_VOCAB = 256 + 1  # 256 byte tokens + <|endoftext|>
MAX_VOCAB = 2**20
TOKENIZER_FILE = "tokenizer.json"
"""The Hugging Face tokenizer file of a saved tokenizer folder (:meth:`Tokenizer.save`)."""
META_FILE = "coupled_qk_tokenizer.json"  # the name and fingerprint written beside tokenizer.json
# A character that is not whitespace for Python's ``re`` (== str.isspace, a superset of Unicode
# White_Space) nor a zero-width/format character some regex engines once classed as space.
_NWS = r"[^\s\u180e\u200b-\u200d\u2060\ufeff]"
# Safe cut positions (proof in :func:`chunk_text`): just before a " " or "\n" that is followed by a
# non-space character.
_SAFE_SPLIT = re.compile(rf"[ \n](?={_NWS})")


def chunk_text(text: str, target_chars: int, avoid: Sequence[str] = ()) -> list[str]:
    """Cut ``text`` into pieces of about ``target_chars`` characters whose GPT-2-regex encodings concatenate
    to the encoding of the whole text (``"".join(pieces) == text`` always).

    A cut is made at the first safe position at or after each ``target_chars`` step: just before a ``" "``
    or ``"\n"`` that ends a whitespace run ``W`` and is followed by a non-space character ``Y`` that does not
    start any string in ``avoid`` (the added/special tokens). Proof sketch: in the whole text the rule
    ``\\s+(?!\\S)`` backtracks, so ``W`` is pre-tokenized as ``W[:-1]`` (if non-empty) then ``W[-1]``, with a
    ``" "`` joining ``Y`` (``" ?X+"`` rules) and a ``"\n"`` standing alone (``\\s+``); the left piece ends with
    ``W[:-1]`` (one ``\\s+(?!\\S)`` token at the end of a string) or with the non-space token before it, and
    the right piece starts with ``W[-1] + Y``, tokenized as in the whole text because the regex has no
    look-behind. No pre-token crosses the cut, so the BPE ids are the same. A special token at ``Y`` would
    end the pre-tokenized span after ``W`` (making ``W`` one pre-token, e.g. ``"\n\n"`` = id 628), hence
    ``avoid``. Pieces are longer than ``target_chars`` where safe positions are rare.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    if isinstance(target_chars, bool) or not isinstance(target_chars, int) or target_chars < 1:
        raise ValueError(f"target_chars={target_chars!r} must be a positive int")
    pieces, start, n = [], 0, len(text)
    while n - start > target_chars:
        pos, cut = start + target_chars, None
        while (m := _SAFE_SPLIT.search(text, pos)) is not None:
            if not any(text.startswith(a, m.end()) for a in avoid):
                cut = m.start()
                break
            pos = m.end()
        if cut is None:
            break
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


class Tokenizer:
    """A Hugging Face ``tokenizers.Tokenizer`` with the small interface the library uses.

    Attributes:
        name: ``"gpt2"``, ``"bpe-<N>"`` or the name stored with a saved tokenizer.
        vocab_size: ``max token id + 1`` (int); GPT-2: 50,257.
        eot_id: id of ``<|endoftext|>`` (GPT-2: 50256), or ``None`` if the tokenizer lacks it.
        fingerprint: sha256 hex digest of the tokenizer's JSON (keys sorted); equal for equal tokenizers,
            used in cache keys. May change with a ``tokenizers`` version that serializes new fields.
        added_tokens: contents of the added/special tokens.
        chunk_safe: True if :func:`chunk_text` pieces provably encode like the whole text (no normalizer,
            GPT-2-regex ByteLevel pre-tokenizer, no whitespace-stripping added tokens).
    """

    def __init__(self, hf_tokenizer: HFTokenizer, name: str):
        if not isinstance(hf_tokenizer, HFTokenizer):
            raise TypeError(f"hf_tokenizer must be a tokenizers.Tokenizer, got {type(hf_tokenizer).__name__}")
        self._tok, self.name = hf_tokenizer, str(name)
        cfg = json.loads(hf_tokenizer.to_str())
        self.fingerprint = _fingerprint_of(cfg)
        added = cfg.get("added_tokens") or []
        self.added_tokens = [t["content"] for t in added]
        pre = cfg.get("pre_tokenizer") or {}
        self.chunk_safe = (
            cfg.get("normalizer") is None
            and pre.get("type") == "ByteLevel"
            and pre.get("use_regex", True)
            and not pre.get("add_prefix_space", False)
            and not any(t.get(k) for t in added for k in ("lstrip", "rstrip", "single_word"))
        )
        self.vocab_size = max(hf_tokenizer.get_vocab(with_added_tokens=True).values()) + 1
        self.eot_id = hf_tokenizer.token_to_id(EOT)

    @property
    def hf(self) -> HFTokenizer:
        """The wrapped Hugging Face tokenizer."""
        return self._tok

    def encode(self, text: str) -> list[int]:
        """Token ids (ints in ``[0, vocab_size)``) of ``text``; no BOS/EOS is added."""
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """``[encode(t) for t in texts]``, computed in parallel by the Rust library."""
        texts = list(texts) if not isinstance(texts, str) else None
        if texts is None or not all(isinstance(t, str) for t in texts):
            raise TypeError("texts must be a sequence of str (not a single str)")
        fast = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
        return [e.ids for e in fast(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of token ids (list, tuple, NumPy array or tensor of ints); special tokens are kept.

        A sequence cut inside a multi-byte UTF-8 character decodes that character as U+FFFD.

        Raises:
            ValueError: an id outside ``[0, vocab_size)``.
        """
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.vocab_size:
                raise ValueError(f"ids contains {i!r}; expected ints in [0, {self.vocab_size})")
        return self._tok.decode(ids, skip_special_tokens=False)

    def save(self, directory: str | Path) -> Path:
        """Write ``<directory>/tokenizer.json`` (Hugging Face format) and ``coupled_qk_tokenizer.json``
        (name, fingerprint); create ``directory`` if needed. Returns the ``tokenizer.json`` path."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / TOKENIZER_FILE
        write_text_atomic(
            path, self._tok.to_str(pretty=True)
        )  # as Tokenizer.save writes it, but atomic: a crash never leaves half a tokenizer
        meta = {"name": self.name, "fingerprint": self.fingerprint, "vocab_size": self.vocab_size}
        write_text_atomic(directory / META_FILE, json.dumps(meta, indent=1) + "\n")
        return path

    @classmethod
    def load(cls, directory: str | Path) -> Tokenizer:
        """Load a tokenizer saved by :meth:`save` (a folder holding ``tokenizer.json``, or the json file).

        Where the folder holds ``coupled_qk_tokenizer.json`` (what :meth:`save` writes), the fingerprint recorded
        there is checked against the ``tokenizer.json`` actually read (:func:`file_fingerprint`: its content, so
        a newer ``tokenizers`` version that serializes more fields still matches): a tokenizer file replaced or
        edited after it was saved is refused, even one of the same size.

        Raises:
            FileNotFoundError: no ``tokenizer.json`` there. ValueError: the file is not a valid tokenizer,
                ``coupled_qk_tokenizer.json`` is not a JSON object, or its fingerprint differs from the
                tokenizer file's (each naming the file or folder).
        """
        path = Path(directory)
        path = path / TOKENIZER_FILE if path.is_dir() else path
        if not path.is_file():
            raise FileNotFoundError(
                f"tokenizer file {path} does not exist (expected a folder written by "
                "Tokenizer.save or a tokenizer.json file)"
            )
        try:
            hf = HFTokenizer.from_file(str(path))
        except Exception as e:  # the Rust library raises a bare Exception on bad JSON
            raise ValueError(f"{path} is not a valid Hugging Face tokenizer.json: {e}") from e
        meta = _read_meta(path.parent / META_FILE)
        recorded = meta.get("fingerprint")
        found = file_fingerprint(path) if recorded is not None else None
        if found != recorded:
            raise ValueError(
                f"tokenizer folder {path.parent}: {path.name} is not the tokenizer recorded in {META_FILE} (its "
                f"fingerprint {found[:12]} differs from the recorded {str(recorded)[:12]}): it was "
                f"replaced or edited after it was saved; restore the saved {path.name}"
            )
        return cls(hf, meta.get("name") or f"file:{path}")

    def __repr__(self) -> str:
        return f"Tokenizer(name={self.name!r}, vocab_size={self.vocab_size}, eot_id={self.eot_id})"


def _fingerprint_of(config: dict) -> str:
    """SHA-256 hex digest of a tokenizer's JSON ``config`` with sorted keys (:attr:`Tokenizer.fingerprint`)."""
    canon = json.dumps(config, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


def file_fingerprint(path: str | Path) -> str:
    """The fingerprint of the tokenizer stored in the ``tokenizer.json`` file ``path``, computed from the file's
    content (as :meth:`Tokenizer.save` recorded it), not from a re-serialization by this ``tokenizers`` version.

    Raises:
        ValueError: the file is not UTF-8 JSON (naming it).
    """
    try:
        return _fingerprint_of(json.loads(Path(path).read_text(encoding="utf-8")))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not a valid tokenizer.json ({e})") from e


def _read_meta(path: Path) -> dict:
    """``coupled_qk_tokenizer.json`` (name, fingerprint, vocab_size) as a dict, ``{}`` where there is none.

    Raises:
        ValueError: the file is not a UTF-8 JSON object, or its name or fingerprint is not a string (naming it).
    """
    if not path.is_file():
        return {}
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(
            f"{path} is not valid JSON ({e}); it should hold the tokenizer's name and fingerprint, "
            "as Tokenizer.save writes it"
        ) from e
    if not isinstance(meta, dict):
        raise ValueError(f"{path} is not a JSON object; it should hold the tokenizer's name and fingerprint")
    for key in ("name", "fingerprint"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            raise ValueError(f"{path}: {key}={meta[key]!r} is not a string")
    return meta


def gpt2_tokenizer(data_dir: str | Path | None = None) -> Tokenizer:
    """The GPT-2 tokenizer (50,257 ids, ``<|endoftext|>`` = 50256), loaded offline.

    Reads ``<data_dir>/tokenizer/gpt2/vocab.json`` + ``merges.txt`` (the official ``encoder.json`` /
    ``vocab.bpe``), or those two files directly in ``data_dir``; ``data_dir`` defaults to
    :func:`~coupled_qk.data.paths.default_data_dir`. Ids equal tiktoken's ``gpt2`` encoding.

    Raises:
        FileNotFoundError: a file is missing. ValueError: the files are not the GPT-2 vocabulary.
    """
    root = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    folder = root if (root / "vocab.json").is_file() else root / "tokenizer" / "gpt2"
    vocab, merges = folder / "vocab.json", folder / "merges.txt"
    for f in (vocab, merges):
        if not f.is_file():
            raise FileNotFoundError(
                f"tokenizer 'gpt2': expected file {f} does not exist (data dir searched: "
                f"{root}); pass --data-dir (data_dir=) or set {DATA_ENV}"
            )
    hf = HFTokenizer(models.BPE.from_file(str(vocab), str(merges)))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([EOT])
    tok = Tokenizer(hf, "gpt2")
    if tok.vocab_size != 50257 or tok.eot_id != 50256 or tok.encode("Hello world") != [15496, 995]:
        raise ValueError(
            f"{vocab} / {merges} are not the GPT-2 BPE files (vocab_size={tok.vocab_size}, eot_id={tok.eot_id})"
        )
    return tok


def _check_vocab_size(vocab_size: int) -> int:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__} ({vocab_size!r})")
    if not MIN_VOCAB <= vocab_size <= MAX_VOCAB:
        raise ValueError(
            f"vocab_size={vocab_size} must be in [{MIN_VOCAB}, {MAX_VOCAB}] (256 byte tokens + <|endoftext|> at least)"
        )
    return vocab_size


def train_bpe(texts: Iterable[str] | str, vocab_size: int, min_frequency: int = 2) -> Tokenizer:
    """Train a byte-level BPE tokenizer (GPT-2 regex, no prefix space) with Hugging Face ``tokenizers``.

    Args:
        texts: training text(s): a str or an iterable of str (each cut at :func:`chunk_text` safe points,
            so the pre-token counts equal those of the whole texts).
        vocab_size: requested size incl. 256 byte tokens and ``<|endoftext|>`` (id 0), in [257, 2**20].
            The result is smaller if the text supports fewer merges of frequency >= ``min_frequency``.
        min_frequency: minimum pair count for a merge (int >= 1).

    Returns:
        A :class:`Tokenizer` named ``bpe-<N>`` with ``N`` its real vocabulary size; deterministic for the same
        inputs. When the text supports fewer tokens than requested, ``N < vocab_size`` and a
        :class:`UserWarning` says so (the label never claims a size the tokenizer does not have).
    """
    vocab_size = _check_vocab_size(vocab_size)
    if isinstance(min_frequency, bool) or not isinstance(min_frequency, int) or min_frequency < 1:
        raise ValueError(f"min_frequency={min_frequency!r} must be an int >= 1")
    texts = [texts] if isinstance(texts, str) else texts
    seen = [0]

    def pieces() -> Iterator[str]:
        for t in texts:
            if not isinstance(t, str):
                raise TypeError(f"texts must contain str, got {type(t).__name__}")
            seen[0] += len(t)
            yield from chunk_text(t, 1 << 16, (EOT,))

    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=progress_mode() != "off" and sys.stderr.isatty(),
    )
    hf.train_from_iterator(pieces(), trainer=trainer)
    if seen[0] == 0:
        raise ValueError("texts is empty: train_bpe needs training text")
    tok = Tokenizer(hf, f"bpe-{vocab_size}")
    if tok.vocab_size < vocab_size:
        warnings.warn(
            f"bpe-{vocab_size}: the training text ({seen[0]:,} characters) supports only "
            f"{tok.vocab_size:,} tokens (merges seen at least {min_frequency} times); the tokenizer is "
            f"labelled bpe-{tok.vocab_size}. Use more text or a smaller vocabulary.",
            stacklevel=2,
        )
        tok.name = f"bpe-{tok.vocab_size}"
    return tok


def check_tokenizer_spec(option: str, spec) -> str:
    """Check a tokenizer spec where it enters (``--tokenizer``, ``TrainConfig.tokenizer``, :func:`get_tokenizer`),
    before any corpus is read or BPE trained: ``"gpt2"``; ``"bpe-<N>"`` with ``N`` in ``[257, 2**20]``; or an
    existing tokenizer folder / ``tokenizer.json`` file, or a folder with the GPT-2 ``vocab.json`` and
    ``merges.txt``.

    Returns:
        ``spec`` as a str.

    Raises:
        TypeError: ``spec`` is not a str or path. ValueError: one line naming ``option``, the value and what was
            expected (a malformed or out-of-range ``bpe-<N>``, a path that does not exist, a folder with neither
            ``tokenizer.json`` nor both ``vocab.json`` and ``merges.txt``).
    """
    if not isinstance(spec, (str, Path)):
        raise TypeError(f"{option} must be a str, got {type(spec).__name__}")
    spec = str(spec)
    expected = (
        "expected 'gpt2', 'bpe-<N>' (a byte-level BPE of N tokens trained on the training split, e.g. "
        "'bpe-8192') or an existing tokenizer folder / tokenizer.json"
    )
    if spec == "gpt2":
        return spec
    m = re.fullmatch(r"bpe-(\d+)", spec)
    if m is not None or (spec.startswith("bpe-") and not Path(spec).expanduser().exists()):
        if m is None or not MIN_VOCAB <= int(m.group(1)) <= MAX_VOCAB:
            raise ValueError(
                f"{option}={spec!r}: a trained BPE is 'bpe-<N>' with N an integer in [{MIN_VOCAB}, "
                f"{MAX_VOCAB}] (256 byte tokens + <|endoftext|> at least), e.g. 'bpe-8192'"
            )
        return spec
    path = Path(spec).expanduser()
    if not path.exists():
        raise ValueError(f"{option}={spec!r} is not an existing file or folder; {expected}")
    if path.is_dir() and not (path / TOKENIZER_FILE).is_file():
        pair = [n for n in ("vocab.json", "merges.txt") if (path / n).is_file()]
        if len(pair) == 1:
            missing = ({"vocab.json", "merges.txt"} - set(pair)).pop()
            raise ValueError(
                f"{option}={spec!r}: the folder holds {pair[0]} but not {missing}; a byte-level BPE "
                "needs both (the GPT-2 vocab.json and merges.txt)"
            )
        if not pair:
            raise ValueError(
                f"{option}={spec!r}: the folder holds no tokenizer.json (what Tokenizer.save writes) "
                "and no vocab.json + merges.txt; " + expected
            )
    return spec


def get_tokenizer(
    spec: str, train_text: Iterable[str] | str | None = None, data_dir: str | Path | None = None
) -> Tokenizer:
    """Build a tokenizer from a spec string.

    Args:
        spec: ``"gpt2"`` (:func:`gpt2_tokenizer`), ``"bpe-<N>"`` (:func:`train_bpe` on ``train_text`` with
            vocab size N), a path to a saved tokenizer folder / ``tokenizer.json``, or a folder holding the GPT-2
            ``vocab.json`` and ``merges.txt`` (:func:`gpt2_tokenizer` of that folder).
        train_text: training text(s) for ``bpe-<N>``.
        data_dir: data folder for ``gpt2``.

    Raises:
        ValueError: a spec :func:`check_tokenizer_spec` refuses, ``bpe-<N>`` without ``train_text``.
    """
    spec = check_tokenizer_spec("tokenizer", spec)
    if spec == "gpt2":
        return gpt2_tokenizer(data_dir)
    path = Path(spec).expanduser()
    if re.fullmatch(r"bpe-\d+", spec):  # always a BPE to train, even where a folder of that name exists
        if train_text is None:
            raise ValueError(f"tokenizer spec {spec!r} trains a BPE and needs train_text")
        return train_bpe(train_text, int(spec[len("bpe-") :]))
    if path.is_dir() and not (path / TOKENIZER_FILE).is_file():
        return gpt2_tokenizer(path)
    return Tokenizer.load(path)

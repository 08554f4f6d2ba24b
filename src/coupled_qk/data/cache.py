"""Token caches: a text tokenized once, stored as a flat binary file and memory-mapped afterwards.

Layout (``cache_dir``, default :func:`~coupled_qk.data.paths.default_cache_dir`)::

    <sha256(text)[:16]>-<tokenizer.fingerprint[:16]>[-eot].bin   # ids, little-endian uint16 / uint32
    <same stem>.json                                               # sidecar, written after the .bin

The sidecar holds ``n_tokens``, ``dtype``, tokenizer name and fingerprint, the full text sha256, the sha256
of the ``.bin`` bytes and the creation time. A cache is reused only if the sidecar parses, describes the
same text / tokenizer / mode, and the ``.bin`` has exactly ``n_tokens * itemsize`` bytes with the recorded
sha256; otherwise it is rebuilt. Both files are written atomically (temp file in the same folder, fsync,
``os.replace``), so concurrent writers and crashes never leave a partial file under the final name.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

import numpy as np

from coupled_qk.data.corpora import split_documents
from coupled_qk.data.paths import default_cache_dir
from coupled_qk.data.tokenizers import Tokenizer, chunk_text
from coupled_qk.files import atomic_write
from coupled_qk.progress import progress

log = logging.getLogger(__name__)
FORMAT_VERSION = 1
CHUNK_CHARS = 1 << 16  # target characters per encode_batch item
BATCH_CHUNKS = 256  # items per encode_batch call (bounds the Python-list memory)


def token_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` if ``vocab_size <= 65536`` else ``uint32`` (little-endian)."""
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def _encode_pieces(pieces: list[str], tokenizer: Tokenizer, dtype: np.dtype) -> list[np.ndarray]:
    out = []
    n_chars = sum(len(p) for p in pieces)
    with progress(n_chars, f"tokenizing with {tokenizer.name}", "chars", enabled=n_chars > 1_000_000) as bar:
        for i in range(0, len(pieces), BATCH_CHUNKS):
            batch = pieces[i : i + BATCH_CHUNKS]
            out.extend(np.asarray(ids, dtype=dtype) for ids in tokenizer.encode_batch(batch))
            bar.update(sum(len(p) for p in batch))
    return out


def encode_text(
    text: str, tokenizer: Tokenizer, *, append_eot_between_docs: bool = False, chunk_chars: int = CHUNK_CHARS
) -> np.ndarray:
    """Token ids of ``text``, computed in parallel chunks; identical to ``tokenizer.encode(text)``.

    Chunks are cut only at :func:`~coupled_qk.data.tokenizers.chunk_text` safe points, and only if
    ``tokenizer.chunk_safe``; otherwise the text (each document) is encoded in one call.

    Args:
        append_eot_between_docs: if True, ``text`` is split into documents with
            :func:`~coupled_qk.data.corpora.split_documents` (blank-line paragraphs, the rule
            ``load_corpus`` uses), each is encoded on its own, and ``tokenizer.eot_id`` is put between
            consecutive documents; the blank lines themselves are not encoded.

    Returns:
        1-D array of ids, dtype :func:`token_dtype` ``(tokenizer.vocab_size)``.

    Raises:
        ValueError: ``append_eot_between_docs`` with a tokenizer without ``<|endoftext|>``, or no documents.
    """
    dtype = token_dtype(tokenizer.vocab_size)
    docs = split_documents(text) if append_eot_between_docs else [text]
    if append_eot_between_docs:
        if tokenizer.eot_id is None:
            raise ValueError(
                f"append_eot_between_docs=True but tokenizer {tokenizer.name!r} has no <|endoftext|> token"
            )
        if not docs:
            raise ValueError("append_eot_between_docs=True but text holds no non-blank document")
    pieces, owner = [], []
    for d, doc in enumerate(docs):
        parts = chunk_text(doc, chunk_chars, tokenizer.added_tokens) if tokenizer.chunk_safe else [doc]
        pieces.extend(parts)
        owner.extend([d] * len(parts))
    arrays = _encode_pieces(pieces, tokenizer, dtype)
    if append_eot_between_docs:
        eot = np.array([tokenizer.eot_id], dtype=dtype)
        out = []
        for k, arr in enumerate(arrays):
            if k and owner[k] != owner[k - 1]:
                out.append(eot)
            out.append(arr)
        arrays = out
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype)


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def _valid_cache(bin_path: Path, meta_path: Path, expected: dict) -> dict | None:
    """The sidecar dict if the cache at ``bin_path`` is complete and matches ``expected``, else None."""
    if not (bin_path.is_file() and meta_path.is_file()):
        return None
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if any(meta.get(k) != v for k, v in expected.items()):
            return None
        size = int(meta["n_tokens"]) * np.dtype(meta["dtype"]).itemsize
        if bin_path.stat().st_size != size or _file_sha256(bin_path) != meta["bin_sha256"]:
            return None
        return meta
    except (OSError, ValueError, KeyError, TypeError):
        return None


def cache_paths(
    text: str,
    tokenizer: Tokenizer,
    cache_dir: str | Path | None = None,
    *,
    append_eot_between_docs: bool = False,
    text_sha256: str | None = None,
) -> tuple[Path, Path]:
    """``(bin_path, sidecar_path)`` that :func:`tokenize_to_cache` uses for these arguments."""
    directory = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    text_hash = text_sha256 or hashlib.sha256(text.encode("utf-8")).hexdigest()
    stem = f"{text_hash[:16]}-{tokenizer.fingerprint[:16]}" + ("-eot" if append_eot_between_docs else "")
    return directory / f"{stem}.bin", directory / f"{stem}.json"


def tokenize_to_cache(
    text: str, tokenizer: Tokenizer, cache_dir: str | Path | None = None, *, append_eot_between_docs: bool = False
) -> np.memmap:
    """Tokenize ``text`` once and memory-map the ids from an on-disk cache (see the module docstring).

    Args:
        text: the text (non-empty str), e.g. one split of a :class:`~coupled_qk.data.corpora.Corpus`.
        tokenizer: a :class:`~coupled_qk.data.tokenizers.Tokenizer`.
        cache_dir: cache folder (created if missing); default ``default_cache_dir()``.
        append_eot_between_docs: see :func:`encode_text`; cached under a separate ``-eot`` name.

    Returns:
        A read-only 1-D ``numpy.memmap`` of token ids, dtype ``uint16`` if ``vocab_size <= 65536`` else
        ``uint32``, equal to ``tokenizer.encode(text)`` (or the EOT-joined documents).

    Raises:
        TypeError / ValueError: ``text`` is not a non-empty str, ``tokenizer`` is not a Tokenizer, or
            :func:`encode_text` rejects the input. OSError: the cache folder cannot be written.
    """
    if not isinstance(text, str) or not text:
        raise ValueError(
            f"text must be a non-empty str, got {type(text).__name__} of length "
            f"{len(text) if isinstance(text, str) else 'n/a'}"
        )
    if not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"tokenizer must be a coupled_qk Tokenizer, got {type(tokenizer).__name__}")
    text_hash = hashlib.sha256(text.encode("utf-8")).hexdigest()
    eot = bool(append_eot_between_docs)
    bin_path, meta_path = cache_paths(text, tokenizer, cache_dir, append_eot_between_docs=eot, text_sha256=text_hash)
    dtype = token_dtype(tokenizer.vocab_size)
    expected = {
        "format_version": FORMAT_VERSION,
        "text_sha256": text_hash,
        "tokenizer_fingerprint": tokenizer.fingerprint,
        "dtype": dtype.str,
        "append_eot_between_docs": eot,
    }
    meta = _valid_cache(bin_path, meta_path, expected)
    if meta is None:
        if bin_path.exists() or meta_path.exists():
            log.warning("token cache %s is incomplete or inconsistent; rebuilding it", bin_path)
        bin_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        ids = encode_text(text, tokenizer, append_eot_between_docs=eot)
        seconds = time.perf_counter() - t0
        atomic_write(bin_path, ids.tofile)
        meta = dict(
            expected,
            n_tokens=int(ids.size),
            tokenizer_name=tokenizer.name,
            bin_sha256=hashlib.sha256(ids.tobytes()).hexdigest(),
            n_chars=len(text),
            encode_seconds=round(seconds, 3),
            created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        )
        atomic_write(meta_path, lambda f: f.write((json.dumps(meta, indent=1) + "\n").encode("utf-8")))
    return np.memmap(bin_path, dtype=dtype, mode="r", shape=(int(meta["n_tokens"]),))

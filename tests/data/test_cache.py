"""Token cache: chunked encoding equals whole-text encoding; cache reuse, keys, corruption, atomicity."""

from __future__ import annotations

import hashlib
import json
import logging
import re

import numpy as np
import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

import coupled_qk.files
from coupled_qk.data.cache import cache_paths, encode_text, token_dtype, tokenize_to_cache
from coupled_qk.data.tokenizers import Tokenizer, chunk_text


@pytest.fixture(scope="module")
def real_slices(data_dir) -> dict[str, str]:
    """~60 kB from the middle of each shared corpus file (different layouts: WikiText, abstracts, ...)."""
    files = ["wiki-vital/train.txt", "pubmed/abstracts.txt", "wikitext-2/valid.txt"]
    files += [f"mixed-domain/{p.name}" for p in sorted((data_dir / "mixed-domain").glob("*.txt"))]
    out = {}
    for rel in files:
        text = (data_dir / rel).read_text(encoding="utf-8")
        out[rel] = text[len(text) // 3 : len(text) // 3 + 60_000]
    return out


@pytest.mark.slow
def test_chunked_encoding_equals_whole_on_real_text(gpt2, small_bpe, real_slices):
    for name, text in real_slices.items():
        n_chunks = len(chunk_text(text, 300, gpt2.added_tokens))
        assert n_chunks > 100, name  # the test really cuts the text
        for tok in (gpt2, small_bpe):
            got = encode_text(text, tok, chunk_chars=300)
            assert got.dtype == np.uint16
            np.testing.assert_array_equal(got, np.asarray(tok.encode(text)), err_msg=f"{name} / {tok.name}")


def test_cache_roundtrip_and_hit(tmp_path, gpt2, wiki_head, monkeypatch):
    arr = tokenize_to_cache(wiki_head, gpt2, tmp_path)
    assert isinstance(arr, np.memmap) and arr.dtype == np.uint16 and arr.ndim == 1
    assert arr.tolist() == gpt2.encode(wiki_head)
    with pytest.raises(ValueError):
        arr[0] = 1  # read-only
    bin_path, meta_path = cache_paths(wiki_head, gpt2, tmp_path)
    assert bin_path.name == f"{hashlib.sha256(wiki_head.encode()).hexdigest()[:16]}-{gpt2.fingerprint[:16]}.bin"
    meta = json.loads(meta_path.read_text())
    assert meta["n_tokens"] == len(arr) and meta["dtype"] == "<u2" and meta["tokenizer_name"] == "gpt2"
    assert bin_path.stat().st_size == 2 * len(arr)
    mtime = bin_path.stat().st_mtime_ns

    def boom(*a, **k):
        raise AssertionError("re-tokenized on a cache hit")

    monkeypatch.setattr(gpt2, "encode_batch", boom)
    again = tokenize_to_cache(wiki_head, gpt2, tmp_path)
    np.testing.assert_array_equal(again, arr)
    assert bin_path.stat().st_mtime_ns == mtime
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([bin_path.name, meta_path.name])


def test_default_cache_dir_is_used(tmp_path, gpt2, monkeypatch):
    monkeypatch.setenv("COUPLED_QK_CACHE", str(tmp_path / "envcache"))
    arr = tokenize_to_cache("Hello world", gpt2)
    assert arr.tolist() == [15496, 995] and len(list((tmp_path / "envcache").glob("*.bin"))) == 1


def test_keys_differ(tmp_path, gpt2, small_bpe):
    a = cache_paths("text one", gpt2, tmp_path)[0]
    assert a != cache_paths("text two", gpt2, tmp_path)[0]
    assert a != cache_paths("text one", small_bpe, tmp_path)[0]
    assert cache_paths("text one", gpt2, tmp_path, append_eot_between_docs=True)[0].name.endswith("-eot.bin")
    assert tokenize_to_cache("text one", small_bpe, tmp_path).tolist() == small_bpe.encode("text one")
    assert tokenize_to_cache("text one", gpt2, tmp_path).tolist() == gpt2.encode("text one")


@pytest.mark.parametrize("damage", ["truncate", "flip", "sidecar_garbage", "sidecar_missing", "wrong_count"])
def test_corrupt_cache_is_rebuilt(tmp_path, gpt2, wiki_head, damage, caplog):
    text = wiki_head[:5000]
    good = tokenize_to_cache(text, gpt2, tmp_path).tolist()
    bin_path, meta_path = cache_paths(text, gpt2, tmp_path)
    if damage == "truncate":
        bin_path.write_bytes(bin_path.read_bytes()[:-3])
    elif damage == "flip":
        raw = bytearray(bin_path.read_bytes())
        raw[10] ^= 0xFF
        bin_path.write_bytes(bytes(raw))
    elif damage == "sidecar_garbage":
        meta_path.write_text("{oops")
    elif damage == "sidecar_missing":
        meta_path.unlink()
    else:
        meta = json.loads(meta_path.read_text())
        meta["n_tokens"] -= 1
        meta_path.write_text(json.dumps(meta))
    with caplog.at_level(logging.WARNING, logger="coupled_qk.data.cache"):
        rebuilt = tokenize_to_cache(text, gpt2, tmp_path)
    assert rebuilt.tolist() == good and "rebuilding" in caplog.text
    assert json.loads(meta_path.read_text())["n_tokens"] == len(good)


@pytest.mark.parametrize("fail_at", ["replace", "fsync"])
def test_atomic_write_leaves_no_partial_file(tmp_path, gpt2, monkeypatch, fail_at):
    def fail(*a, **k):
        raise OSError(f"simulated {fail_at} failure")

    monkeypatch.setattr(coupled_qk.files.os, fail_at, fail)
    with pytest.raises(OSError, match="simulated"):
        tokenize_to_cache("some text to cache", gpt2, tmp_path)
    assert list(tmp_path.iterdir()) == []  # neither the .bin nor a temp file
    monkeypatch.undo()
    assert tokenize_to_cache("some text to cache", gpt2, tmp_path).tolist() == gpt2.encode("some text to cache")


def test_eot_between_documents(tmp_path, gpt2, small_bpe):
    text = "first doc\nline two\n\n \nsecond doc\n\n\n\nthird"
    for tok in (gpt2, small_bpe):
        e = tok.eot_id
        want = tok.encode("first doc\nline two") + [e] + tok.encode("second doc") + [e] + tok.encode("third")
        assert tokenize_to_cache(text, tok, tmp_path, append_eot_between_docs=True).tolist() == want
        assert tokenize_to_cache(text, tok, tmp_path).tolist() == tok.encode(text)  # separate cache entry
    with pytest.raises(ValueError, match="no non-blank document"):
        tokenize_to_cache("\n \n", gpt2, tmp_path, append_eot_between_docs=True)


def _word_level(n: int) -> Tokenizer:
    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(n - 1)}}
    hf = HFTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return Tokenizer(hf, f"words-{n}")


def test_large_vocab_uses_uint32_and_unsafe_tokenizers_are_not_chunked(tmp_path):
    tok = _word_level(70_000)
    assert not tok.chunk_safe and tok.eot_id is None
    assert token_dtype(65_536) == np.uint16 and token_dtype(65_537) == np.uint32
    arr = tokenize_to_cache("w69998 w1 nope\nw65536", tok, tmp_path)
    assert arr.dtype == np.uint32 and arr.tolist() == [69_999, 2, 0, 65_537]
    with pytest.raises(ValueError, match=re.escape("has no <|endoftext|> token")):
        tokenize_to_cache("w1", tok, tmp_path, append_eot_between_docs=True)


def test_input_validation(tmp_path, gpt2):
    with pytest.raises(ValueError, match="non-empty str"):
        tokenize_to_cache("", gpt2, tmp_path)
    with pytest.raises(ValueError, match="non-empty str, got bytes"):
        tokenize_to_cache(b"abc", gpt2, tmp_path)
    with pytest.raises(TypeError, match="coupled_qk Tokenizer, got str"):
        tokenize_to_cache("abc", "gpt2", tmp_path)

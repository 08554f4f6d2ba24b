"""Tokenizers: GPT-2 id parity with tiktoken, trained BPE, save/load, chunking safety."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coupled_qk.data.tokenizers import EOT, Tokenizer, chunk_text, get_tokenizer, gpt2_tokenizer, train_bpe

TRICKY = [
    "",
    "Hello world",
    "naïve café — Zürich, Ελληνικά, русский, 日本語のテキスト, عربى, हिन्दी",
    "emoji 🤖🏳️‍🌈👨‍👩‍👧 and flags 🇺🇸 ZWJ\u200dzero\u200bwidth\ufeffbom",
    "multiple   spaces    here     and\ttabs\t\tand   \n   mixed \n\n\n  lines  \r\n crlf\r\n",
    "numbers 123456789 3.14159 1,000,000 0x1F -42 ١٢٣ ²³",
    "contractions: don't can't I'm you're we've they'll he'd it's 'tis O'Neil's 'S 'LL",
    "trailing whitespace   ",
    "\n\n\nleading newlines",
    " \u00a0nbsp\u3000ideographic\u2028line-sep\u2029para\x1cfs\x85nel\u180emongolian",
    "<|endoftext|>doc two<|endoftext|>\n\n<|endoftext|> spaced",
    "code: def f(x):\n    return x**2  # comment\n\n\tif a<=b: pass",
]
FUZZ_ALPHABET = [
    " ",
    " ",
    "\n",
    "\n",
    "\n\n",
    "\t",
    "\r",
    "a",
    "b",
    "1",
    "!",
    "'s",
    "'",
    "\u00a0",
    "\x1c",
    "é",
    "🤖",
    EOT,
    "\u200b",
    "\u3000",
]


def _real_slices(data_dir) -> dict[str, str]:
    out = {}
    for rel in ("wiki-vital/train.txt", "pubmed/abstracts.txt", "wikitext-2/test.txt"):
        out[rel] = (data_dir / rel).read_text(encoding="utf-8")[:200_000]
    for f in sorted((data_dir / "mixed-domain").glob("*.txt")):
        text = f.read_text(encoding="utf-8")
        out[f.name] = text[len(text) // 2 : len(text) // 2 + 40_000]
    return out


def test_gpt2_basics(gpt2):
    assert (gpt2.name, gpt2.vocab_size, gpt2.eot_id) == ("gpt2", 50257, 50256)
    assert gpt2.encode("Hello world") == [15496, 995]
    assert gpt2.encode(" Hello") == [18435]  # no prefix space added
    assert gpt2.encode("a<|endoftext|>b") == [64, 50256, 65]
    assert gpt2.decode([15496, 995, 50256]) == "Hello world<|endoftext|>"
    assert gpt2.encode_batch(["Hello world", "", " Hello"]) == [[15496, 995], [], [18435]]
    assert gpt2.chunk_safe and gpt2.added_tokens == [EOT] and len(gpt2.fingerprint) == 64


@pytest.mark.slow
def test_gpt2_matches_tiktoken_on_real_text(gpt2, tiktoken_gpt2, data_dir):
    for name, text in _real_slices(data_dir).items():
        assert EOT not in text
        ref = tiktoken_gpt2.encode_ordinary(text)
        assert gpt2.encode(text) == ref, name
        assert len(ref) > len(text) // 8
        assert gpt2.decode(ref) == text


def test_gpt2_matches_tiktoken_on_tricky_strings(gpt2, tiktoken_gpt2, tiktoken_gpt2_original):
    for s in TRICKY:
        ids = gpt2.encode(s)
        assert ids == tiktoken_gpt2.encode(s, allowed_special="all"), repr(s)
        assert ids == tiktoken_gpt2_original.encode(s, allowed_special="all"), repr(s)
        assert gpt2.decode(ids) == s
    assert gpt2.encode_batch(TRICKY) == [gpt2.encode(s) for s in TRICKY]


def test_encode_decode_errors(gpt2):
    with pytest.raises(TypeError, match="text must be str"):
        gpt2.encode(b"bytes")
    with pytest.raises(TypeError, match="not a single str"):
        gpt2.encode_batch("abc")
    with pytest.raises(ValueError, match=r"50257.*\[0, 50257\)"):
        gpt2.decode([1, 50257])
    with pytest.raises(ValueError, match="-1"):
        gpt2.decode([-1])
    assert gpt2.decode(np.array([15496, 995], dtype=np.uint16)) == "Hello world"
    assert gpt2.encode("🤖") == [8582, 97, 244]
    assert gpt2.decode([8582, 97]) == "\ufffd"  # cut inside a UTF-8 character


def test_gpt2_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        gpt2_tokenizer(tmp_path)
    assert str(tmp_path / "tokenizer" / "gpt2" / "vocab.json") in str(e.value) and "--data-dir" in str(e.value)
    (tmp_path / "vocab.json").write_text('{"a": 0, "b": 1, "ab": 2}', encoding="utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\n", encoding="utf-8")
    with pytest.raises(ValueError, match="not the GPT-2 BPE files"):
        gpt2_tokenizer(tmp_path)


def test_chunk_text_is_exact_fuzz(gpt2, small_bpe):
    """Every cut chunk_text allows (target 1 = cut wherever allowed) keeps the ids of the whole string."""
    rng = random.Random(0)
    cuts = 0
    for _ in range(1500):
        s = "".join(rng.choice(FUZZ_ALPHABET) for _ in range(rng.randint(0, 40)))
        pieces = chunk_text(s, 1, gpt2.added_tokens)
        assert "".join(pieces) == s
        cuts += len(pieces) - 1
        for tok in (gpt2, small_bpe):
            assert [i for p in pieces for i in tok.encode(p)] == tok.encode(s), repr(s)
    assert cuts > 2000
    # without the special-token guard the cut before "\n<|endoftext|>" changes the ids ("\n\n" = 628)
    s = "x\n\n<|endoftext|>"
    assert chunk_text(s, 1, ()) == ["x\n", "\n<|endoftext|>"] and gpt2.encode(s) == [87, 628, 50256]
    assert [i for p in chunk_text(s, 1, ()) for i in gpt2.encode(p)] != gpt2.encode(s)
    assert chunk_text(s, 1, gpt2.added_tokens) == [s]


def test_chunk_text_sizes_and_errors():
    text = "word " * 10_000
    pieces = chunk_text(text, 1000)
    assert "".join(pieces) == text and len(pieces) == 50 and max(map(len, pieces)) <= 1004
    assert chunk_text("x" * 5000, 10) == ["x" * 5000]  # no safe position: one piece
    with pytest.raises(ValueError, match="target_chars=0"):
        chunk_text(text, 0)


def test_train_bpe(small_bpe, wiki_head, data_dir):
    assert (small_bpe.name, small_bpe.vocab_size, small_bpe.eot_id) == ("bpe-1000", 1000, 0)
    ids = small_bpe.encode(wiki_head)
    assert len(ids) < len(wiki_head.encode("utf-8")) / 2.5  # merges learnt: > 2.5 bytes per token
    assert max(ids) < 1000 and small_bpe.decode(ids) == wiki_head
    unseen = (data_dir / "pubmed" / "abstracts.txt").read_text(encoding="utf-8")[:20_000] + "🤖 Ω\n"
    assert small_bpe.decode(small_bpe.encode(unseen)) == unseen  # byte-level: no unknowns
    again = train_bpe([wiki_head], 1000)  # new Rust hash seeds, same model
    assert again.fingerprint == small_bpe.fingerprint and again.encode(unseen) == small_bpe.encode(unseen)
    assert train_bpe(wiki_head, 600).fingerprint != small_bpe.fingerprint


def test_train_bpe_validation():
    for bad, err, msg in [
        (256, ValueError, "vocab_size=256"),
        (2**20 + 1, ValueError, "vocab_size=1048577"),
        (1000.0, TypeError, "vocab_size must be an int"),
        (True, TypeError, "bool"),
    ]:
        with pytest.raises(err, match=msg):
            train_bpe("some text", bad)
    with pytest.raises(ValueError, match="min_frequency=0"):
        train_bpe("some text", 300, min_frequency=0)
    with pytest.raises(ValueError, match="texts is empty"):
        train_bpe([], 300)
    with pytest.raises(TypeError, match="texts must contain str"):
        train_bpe(["ok", 3], 300)
    assert train_bpe("tiny text", 5000).vocab_size < 5000  # fewer merges than requested


@pytest.mark.slow
def test_save_load_roundtrip(tmp_path, small_bpe, gpt2, wiki_head):
    for tok in (small_bpe, gpt2):
        path = tok.save(tmp_path / tok.name)
        assert path == tmp_path / tok.name / "tokenizer.json"
        for src in (tmp_path / tok.name, path):
            loaded = Tokenizer.load(src)
            assert (loaded.name, loaded.fingerprint, loaded.vocab_size) == (tok.name, tok.fingerprint, tok.vocab_size)
            assert loaded.encode(wiki_head[:20_000]) == tok.encode(wiki_head[:20_000])
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer.load(tmp_path / "missing")
    (tmp_path / "junk.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="junk.json is not a valid"):
        Tokenizer.load(tmp_path / "junk.json")
    with pytest.raises(TypeError, match="hf_tokenizer"):
        Tokenizer("gpt2", "gpt2")


@pytest.mark.slow
def test_get_tokenizer(tmp_path, gpt2, small_bpe, wiki_head, data_dir):
    assert get_tokenizer("gpt2", data_dir=data_dir).fingerprint == gpt2.fingerprint
    assert get_tokenizer("bpe-1000", train_text=wiki_head).fingerprint == small_bpe.fingerprint
    small_bpe.save(tmp_path / "tok")
    assert get_tokenizer(str(tmp_path / "tok")).fingerprint == small_bpe.fingerprint
    with pytest.raises(ValueError, match="needs train_text"):
        get_tokenizer("bpe-1000")
    with pytest.raises(ValueError, match=r"tokenizer='bpe-12': a trained BPE is 'bpe-<N>' with N an integer in \[257"):
        get_tokenizer("bpe-12", train_text="abc")
    with pytest.raises(ValueError, match="'gpt-3' is not an existing file or folder; expected 'gpt2'"):
        get_tokenizer("gpt-3")


def test_smaller_vocabulary_is_labelled_and_warned():
    text = "the cat sat on the mat " * 50
    with pytest.warns(UserWarning, match=r"bpe-4000: the training text .* supports only \d+ tokens"):
        tok = train_bpe(text, 4000)
    assert tok.vocab_size < 4000 and tok.name == f"bpe-{tok.vocab_size}"


def _two_tokenizers_of_one_size():
    """Two byte-level BPEs of the same vocabulary size trained on different texts."""
    from tests.conftest import make_text

    a, b = train_bpe(make_text(200, 0), 300), train_bpe(make_text(200, 1) + " zebra quokka" * 40, 300)
    assert a.vocab_size == b.vocab_size and a.fingerprint != b.fingerprint
    return a, b


def test_saved_fingerprint_is_checked_against_the_tokenizer_file_loaded(tmp_path):
    """A run's ``tokenizer.json`` replaced by another tokenizer of the same size (keeping the run's
    ``coupled_qk_tokenizer.json``) was loaded silently; it is refused naming the folder. The check reads the
    file's content, so the same tokenizer serialized differently (not pretty-printed) still loads."""
    import json

    a, b = _two_tokenizers_of_one_size()
    folder = tmp_path / "run" / "tokenizer"
    a.save(folder)
    assert Tokenizer.load(folder).fingerprint == a.fingerprint
    (folder / "tokenizer.json").write_text(json.dumps(json.loads(a.hf.to_str()), indent=None))
    assert Tokenizer.load(folder).name == a.name  # same content, other bytes
    (folder / "tokenizer.json").write_text(b.hf.to_str(pretty=True))
    with pytest.raises(
        ValueError,
        match=rf"tokenizer folder {folder}: tokenizer.json is not the tokenizer "
        r"recorded in coupled_qk_tokenizer.json",
    ) as err:
        Tokenizer.load(folder)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="is not the tokenizer recorded"):
        get_tokenizer(str(folder))  # train --tokenizer FOLDER reads it the same way
    (folder / "coupled_qk_tokenizer.json").unlink()  # a bare tokenizer.json carries no record to check
    assert Tokenizer.load(folder).fingerprint == b.fingerprint


@settings(max_examples=40)
@given(
    content=st.one_of(
        st.text(max_size=30),
        st.sampled_from(["[\n", "{", "[]", "5", "null", '"x"', '{"name": 5}', '{"fingerprint": []}', "\udcff"]),
    )
)
def test_damaged_tokenizer_metadata_is_one_line_naming_the_file(tmp_path_factory, content):
    """Any content of ``coupled_qk_tokenizer.json`` either loads (a JSON object whose name and fingerprint are
    strings matching the file) or is one ``ValueError`` naming that file: before, ``[`` there made ``eval``,
    ``generate``, ``export``, ``analyze`` and ``train --tokenizer`` say only "Expecting value: line 2 column 1"."""
    folder = tmp_path_factory.mktemp("tok")
    _TINY.save(folder)
    meta = folder / "coupled_qk_tokenizer.json"
    meta.write_bytes(content.encode("utf-8", "surrogateescape"))
    try:
        tok = Tokenizer.load(folder)
    except ValueError as exc:
        assert str(meta) in str(exc) or f"tokenizer folder {folder}" in str(exc)
        assert "\n" not in str(exc)
    else:
        assert tok.fingerprint == _TINY.fingerprint


_TINY = train_bpe("the cat sat on the mat and the dog ran in the park " * 30, 280)

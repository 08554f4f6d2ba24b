"""Shared fixtures for the real-text data tests (skipped when ../shared/data is absent)."""

from __future__ import annotations

import pytest

from coupled_qk.data.paths import default_data_dir
from coupled_qk.data.tokenizers import gpt2_tokenizer, train_bpe


@pytest.fixture(scope="session")
def data_dir():
    try:
        return default_data_dir()
    except FileNotFoundError as e:  # the real-data tests need ../shared/data (or $COUPLED_QK_DATA)
        pytest.fail(f"real data not available: {e}")


@pytest.fixture(scope="session")
def gpt2(data_dir):
    return gpt2_tokenizer(data_dir)


GPT2_ORIGINAL_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _tiktoken_encoding(data_dir, pattern: str | None):
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from tiktoken_ext.openai_public import r50k_pat_str  # the pattern tiktoken's gpt2() uses

    folder = data_dir / "tokenizer" / "gpt2"
    ranks = data_gym_to_mergeable_bpe_ranks(str(folder / "merges.txt"), str(folder / "vocab.json"))
    return tiktoken.Encoding(
        "gpt2-offline",
        pat_str=pattern or r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": 50256},
        explicit_n_vocab=50257,
    )


@pytest.fixture(scope="session")
def tiktoken_gpt2(data_dir):
    """tiktoken's gpt2 encoding, built offline from the shared files with tiktoken's own gpt2 pattern."""
    return _tiktoken_encoding(data_dir, None)


@pytest.fixture(scope="session")
def tiktoken_gpt2_original(data_dir):
    """The same encoding with the regex of the original GPT-2 release."""
    return _tiktoken_encoding(data_dir, GPT2_ORIGINAL_PATTERN)


@pytest.fixture(scope="session")
def wiki_head(data_dir) -> str:
    """The first 200,000 characters of wiki-vital/train.txt."""
    return (data_dir / "wiki-vital" / "train.txt").read_text(encoding="utf-8")[:200_000]


@pytest.fixture(scope="session")
def small_bpe(wiki_head):
    return train_bpe(wiki_head, 1000)

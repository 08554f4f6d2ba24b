"""Perplexity arithmetic against hand computation."""

import math

import pytest
import torch

from coupled_qk.training.perplexity import evaluate_perplexity, perplexity_windows


class Bigram(torch.nn.Module):
    """Logits depend only on the current token: a table we can score by hand."""

    def __init__(self, table):
        super().__init__()
        self.table = table

    def forward(self, idx):
        return self.table[idx]


def hand_nll(tokens, table):
    logp = torch.log_softmax(table.double(), -1)
    return sum(-logp[tokens[i - 1], tokens[i]].item() for i in range(1, len(tokens)))


@pytest.mark.parametrize("stride", [None, 3, 1])
def test_perplexity_equals_hand_computation(stride):
    torch.manual_seed(0)
    table = torch.randn(7, 7)
    tokens = torch.randint(0, 7, (53,))
    res = evaluate_perplexity(Bigram(table), tokens, block_size=8, batch_size=3, stride=stride, n_words=10)
    nll = hand_nll(tokens.tolist(), table)
    assert res["n_tokens"] == 52
    assert res["nll"] == pytest.approx(nll, rel=1e-6)
    assert res["perplexity"] == pytest.approx(math.exp(nll / 52), rel=1e-6)
    assert res["word_perplexity"] == pytest.approx(math.exp(nll / 10), rel=1e-6)


def test_uniform_model_has_vocabulary_perplexity():
    res = evaluate_perplexity(Bigram(torch.zeros(11, 11)), torch.arange(40) % 11, block_size=5)
    assert res["perplexity"] == pytest.approx(11.0, rel=1e-6)  # float32 log-softmax


def test_windows_score_every_target_once():
    for n, block, stride in [(10, 4, None), (10, 4, 2), (100, 16, 5), (5, 8, 3)]:
        targets = []
        for start, length, n_scored in perplexity_windows(n, block, stride):
            assert length <= block
            targets += list(range(start + length - n_scored + 1, start + length + 1))
        assert targets == list(range(1, n))


def test_window_errors():
    with pytest.raises(ValueError, match="n_tokens=1"):
        list(perplexity_windows(1, 4))
    with pytest.raises(ValueError, match="stride=5"):
        list(perplexity_windows(10, 4, 5))


def test_context_longer_than_model_is_an_error():
    from coupled_qk import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=1, d_model=16, n_heads=2))
    with pytest.raises(ValueError, match="block_size=8"):
        evaluate_perplexity(model, torch.arange(40) % 20, block_size=16)


def test_bits_per_byte_and_char_against_hand_computation():
    """Byte tokens (one token per UTF-8 byte) of a text with multi-byte characters: bits per byte is the hand
    NLL in bits over the bytes; bits per character divides the same bits by the (fewer) characters."""
    text = "naïve café — über 9 ℃\n"
    data = text.encode("utf-8")
    tokens = torch.tensor(list(data))
    torch.manual_seed(1)
    table = torch.randn(256, 256)
    res = evaluate_perplexity(Bigram(table), tokens, block_size=8, batch_size=2, n_bytes=len(data), n_chars=len(text))
    bits = hand_nll(tokens.tolist(), table) / math.log(2)
    assert len(data) > len(text)  # the text has multi-byte characters: the two units differ
    assert res["n_bytes"] == len(data) and res["n_chars"] == len(text)
    assert res["bits_per_byte"] == pytest.approx(bits / len(data), rel=1e-6)
    assert res["bits_per_char"] == pytest.approx(bits / len(text), rel=1e-6)
    # a uniform model over 256 byte values costs 8 bits for every scored byte (all but the first)
    uniform = evaluate_perplexity(Bigram(torch.zeros(256, 256)), tokens, block_size=8, n_bytes=len(data))
    assert uniform["bits_per_byte"] == pytest.approx(8 * (len(data) - 1) / len(data), rel=1e-6)


def test_text_units_and_bad_unit_counts():
    from coupled_qk.training.perplexity import text_units

    assert text_units("aé€😀") == {"n_bytes": 1 + 2 + 3 + 4, "n_chars": 4}
    for name in ("n_words", "n_bytes", "n_chars"):
        with pytest.raises(ValueError, match=f"{name}=0 must be a positive integer"):
            evaluate_perplexity(Bigram(torch.zeros(3, 3)), torch.arange(9) % 3, block_size=4, **{name: 0})

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

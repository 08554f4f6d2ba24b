"""The opt-in transposed decoding head (GPT.use_transposed_head): same logits and tokens as lm_head, follows the
weights through optimizer steps, never used with gradients or many rows, not saved."""

import copy
import pickle

import pytest
import torch
import torch._dynamo as dynamo

from coupled_qk import GPT, GPTConfig
from coupled_qk.models.decode_head import TRANSPOSED_HEAD_ROWS


def tiny(**kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=61, block_size=32, n_layer=2, d_model=32, n_heads=4, attention="coupled")
    cfg.update(kw)
    return GPT(GPTConfig(**cfg))


@pytest.mark.parametrize("pad", [1, 16])  # a padded vocabulary keeps dropping its padding columns
def test_logits_and_greedy_tokens_equal_the_plain_head(pad):
    model = tiny(vocab_pad_multiple=pad).eval()
    x = torch.randint(0, 61, (2, 5))
    expected = model.generate(x, 12, temperature=0)
    with torch.no_grad():
        h = torch.randn(3, 32)
        plain = model.logits(h)
    model.use_transposed_head()
    assert model._head_t.shape == (32, model.config.padded_vocab_size) and model._head_t.is_contiguous()
    with torch.no_grad():
        torch.testing.assert_close(model.logits(h), plain, rtol=1e-6, atol=1e-6)
        assert model.logits(h).shape == (3, 61)
    assert torch.equal(model.generate(x, 12, temperature=0), expected)


def test_the_copy_follows_optimizer_steps_and_is_not_used_with_gradients():
    model = tiny()
    model.use_transposed_head()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x = torch.randint(0, 61, (2, 8))
    loss = model.loss(x, x)
    loss.backward()
    opt.step()
    h = torch.randn(1, 32)
    with torch.no_grad():
        torch.testing.assert_close(model.logits(h), h @ model.lm_head.weight.t(), rtol=1e-6, atol=1e-6)
    # with gradients, and for more rows than the limit, the plain head runs (gradients reach the weights)
    out = model.logits(torch.randn(1, 32, requires_grad=True))
    out.sum().backward()
    assert model.lm_head.weight.grad is not None
    calls = []
    model._refresh_transposed_head = lambda: calls.append(1)
    with torch.no_grad():
        model.logits(torch.randn(TRANSPOSED_HEAD_ROWS + 1, 32))
    assert not calls


def test_compiled_decoding_with_the_transposed_head_matches_eager_and_follows_updates():
    from coupled_qk.layers.kv_cache import StaticKVCache

    dynamo.reset()
    model = tiny().eval()
    x = torch.randint(0, 61, (1, 4))
    model.use_transposed_head()
    step = model.compiled_decode_step(backend="eager", fullgraph=True)
    assert torch.equal(model.generate(x, 8, temperature=0, compile=True), model.generate(x, 8, temperature=0))
    with torch.no_grad():
        statics = []
        for _ in range(2):  # two identical prefilled caches: one for the compiled step, one for the eager reference
            cache = model.new_cache(16)
            nxt = model.next_token_logits(x, cache).argmax(-1, keepdim=True)
            statics.append(StaticKVCache.from_cache(cache))
        # the tied head changes in place after the prefill: the compiled step itself must read the new weights
        model.tok_emb.weight.add_(torch.randn(model.tok_emb.weight.shape, generator=torch.Generator().manual_seed(1)))
        got = step(nxt, statics[0])
        model.use_transposed_head(False)
        torch.testing.assert_close(got, model.decode_step(nxt, statics[1]), rtol=1e-5, atol=1e-5)
    dynamo.reset()


def test_not_saved_dropped_by_pickling_and_refused_for_other_heads():
    model = tiny()
    keys = set(model.state_dict())
    model.use_transposed_head()
    assert set(model.state_dict()) == keys
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert clone._head_t is None
        with torch.no_grad():  # rebuilt from the clone's own weights on first use
            h = torch.randn(1, 32)
            torch.testing.assert_close(clone.logits(h), h @ clone.lm_head.weight.t(), rtol=1e-6, atol=1e-6)
    model.use_transposed_head(False)
    assert model._head_t is None
    with pytest.raises(TypeError, match="enabled='yes' must be True or False"):
        model.use_transposed_head("yes")
    model.lm_head = torch.nn.Linear(32, 61)
    with pytest.raises(TypeError, match="bias-free nn.Linear"):
        model.use_transposed_head()

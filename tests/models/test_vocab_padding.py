"""Vocabulary padding (``GPTConfig.vocab_pad_multiple``, issue 28 item 6): the padded head keeps the logits, the
loss and the gradients of the real tokens; padded ids are never scored, sampled, exported or accepted."""

import pytest
import torch

from coupled_qk import GPT, GPTConfig
from coupled_qk.ops.losses import next_token_loss

V = 61  # -> 64 with vocab_pad_multiple=8 or 64


def test_padded_vocab_size_arithmetic_and_validation():
    assert GPTConfig.from_preset("60m").padded_vocab_size == 50257
    assert GPTConfig.from_preset("60m", vocab_pad_multiple=64).padded_vocab_size == 50304 == 786 * 64
    assert GPTConfig(vocab_size=64, vocab_pad_multiple=64).padded_vocab_size == 64
    assert GPTConfig(vocab_size=65, vocab_pad_multiple=64).padded_vocab_size == 128
    for bad in (0, -64):
        with pytest.raises(ValueError, match="vocab_pad_multiple"):
            GPTConfig(vocab_pad_multiple=bad)
    cfg = GPTConfig(vocab_size=V, vocab_pad_multiple=64)
    assert GPTConfig.from_dict(cfg.to_dict()) == cfg
    old = {k: v for k, v in cfg.to_dict().items() if k != "vocab_pad_multiple"}  # a config saved before the field
    assert GPTConfig.from_dict(old).padded_vocab_size == V


@pytest.mark.parametrize("attention", ["standard", "coupled_differential"])
def test_padded_model_equals_unpadded_model_on_real_tokens(attention):
    torch.manual_seed(0)
    base = GPTConfig(vocab_size=V, block_size=16, n_layer=2, d_model=32, n_heads=4, attention=attention)
    plain = GPT(base).double()
    padded = GPT(base.replace(vocab_pad_multiple=64)).double()
    assert padded.tok_emb.weight.shape == (64, 32) and padded.lm_head.weight is padded.tok_emb.weight
    assert torch.equal(padded.tok_emb.weight[V:], torch.zeros(3, 32, dtype=torch.float64))  # starts at zero
    state = plain.state_dict()
    for key in ("tok_emb.weight", "lm_head.weight"):  # large padding rows: they must never count
        state[key] = torch.cat([state[key], torch.randn(3, 32, dtype=torch.float64)])
    padded.load_state_dict(state)
    idx = torch.randint(0, V, (3, 12))
    targets = torch.randint(0, V, (3, 12))
    targets[0, :4] = -100
    out_plain, out_pad = plain(idx), padded(idx)
    assert out_pad.shape == (3, 12, V)
    torch.testing.assert_close(out_pad, out_plain, rtol=1e-12, atol=1e-12)
    loss_plain, loss_pad = plain.loss(idx, targets), padded.loss(idx, targets)
    torch.testing.assert_close(loss_pad, loss_plain, rtol=1e-12, atol=0)
    # independent recomputation: cross-entropy over the real columns of the full (padded) head
    hidden = padded.hidden_states(idx)
    full = hidden @ padded.lm_head.weight.T
    assert full.shape[-1] == 64 and full[..., V:].abs().max() > 5 * out_pad.abs().max()  # padding is in the head
    torch.testing.assert_close(next_token_loss(full[..., :V], targets), loss_plain, rtol=1e-12, atol=0)
    loss_plain.backward()
    loss_pad.backward()
    for (n, p0), (_, p1) in zip(plain.named_parameters(), padded.named_parameters()):
        g1 = p1.grad[:V] if n == "tok_emb.weight" else p1.grad
        torch.testing.assert_close(g1, p0.grad, rtol=1e-10, atol=1e-14, msg=n)
    assert torch.equal(padded.tok_emb.weight.grad[V:], torch.zeros(3, 32, dtype=torch.float64))
    with torch.no_grad():  # cached decoding logits
        cache = padded.new_cache()
        padded(idx[:, :5], cache)
        step = padded.next_token_logits(idx[:, 5:6], cache)
    assert step.shape == (3, V)
    torch.testing.assert_close(step, out_plain[:, 5], rtol=1e-10, atol=1e-12)


def test_padded_ids_are_never_sampled_or_accepted():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=V, vocab_pad_multiple=64, block_size=32, n_layer=1, d_model=16, n_heads=2))
    with torch.no_grad():  # every hidden state is ~ln_f.bias = 10 b: the padding rows 100 b would win by far
        b = torch.nn.functional.normalize(torch.randn(16), dim=0)
        model.ln_f.bias.copy_(10 * b)
        model.tok_emb.weight[V:] = 100 * b
        full = model.hidden_states(torch.randint(0, V, (2, 5))) @ model.lm_head.weight.T
        assert (full.argmax(-1) >= V).all()
    prompt = torch.randint(0, V, (4, 3))
    sampled = dict(generator=torch.Generator().manual_seed(1))
    for kw in (dict(temperature=0.0), dict(temperature=1.0, **sampled), dict(temperature=2.0, top_k=70, **sampled)):
        out = model.generate(prompt, 20, **kw)
        assert out.max() < V
    with pytest.raises(ValueError, match=r"\[0, 61\)"):
        model(torch.tensor([[V]]))


@pytest.mark.slow
def test_hf_wrapper_and_gpt2_export_drop_the_padding():
    pytest.importorskip("transformers")
    from coupled_qk.hf.gpt2_export import gpt_to_gpt2
    from coupled_qk.hf.modeling import CoupledQKForCausalLM

    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=V, vocab_pad_multiple=64, block_size=16, n_layer=1, d_model=16, n_heads=2, position="learned"
    )
    model = GPT(cfg).eval()
    idx = torch.randint(0, V, (2, 7))
    with torch.no_grad():
        ref = model(idx)
        hf = CoupledQKForCausalLM.from_gpt(model).eval()
        assert hf.config.vocab_pad_multiple == 64
        torch.testing.assert_close(hf(input_ids=idx).logits, ref)
        gpt2 = gpt_to_gpt2(model)
        assert gpt2.transformer.wte.weight.shape == (V, 16)
        torch.testing.assert_close(gpt2(idx).logits, ref, rtol=1e-5, atol=1e-5)

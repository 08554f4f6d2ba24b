"""What a ``transformers`` user tries on a causal LM, checked against what ``GPT2LMHeadModel`` (the reference
semantics) does for the same call: generation modes with and without the cache, the forward API
(``logits_to_keep``, ``inputs_embeds``) and loading. Tiny random models, nothing downloaded."""

import pytest
import torch

pytest.importorskip("transformers")

from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from coupled_qk import GPT, GPTConfig  # noqa: E402
from coupled_qk.hf import CoupledQKForCausalLM  # noqa: E402

V = 53


def tiny_lm(attention="coupled", seed=0) -> CoupledQKForCausalLM:
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=V, block_size=40, n_layer=2, d_model=32, n_heads=4, n_kv_heads=2, attention=attention)
    if cfg.qk_map is not None and hasattr(cfg.qk_map, "dt_init"):
        cfg = cfg.replace(dt_init=0.5)
    return CoupledQKForCausalLM.from_gpt(GPT(cfg), pad_token_id=0, eos_token_id=V - 1).eval()


def gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=V, n_positions=40, n_layer=2, n_embd=32, n_head=4, pad_token_id=0,
                     bos_token_id=V - 1, eos_token_id=V - 1)
    return GPT2LMHeadModel(cfg).eval()


def ids(*shape, seed=0):
    return torch.randint(1, V - 1, shape, generator=torch.Generator().manual_seed(seed))


def left_padded():
    x = ids(3, 6)
    x[0, :2], x[2, :4] = 0, 0
    return x, (x != 0).long()


# --------------------------------------------------------------------------------------------------------------
# forward API
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", [tiny_lm, gpt2], ids=["coupled_qk", "gpt2"])
def test_logits_to_keep_as_a_tensor_of_positions(model):
    """``transformers``' models take ``logits_to_keep`` as an int (the last n) or a 1-D tensor of positions;
    ours failed on the tensor with "Boolean value of Tensor with more than one value is ambiguous"."""
    lm, x = model(), ids(2, 7)
    with torch.no_grad():
        full = lm(x).logits
        for keep in (torch.tensor([0, 3, 6]), torch.tensor([-1]), torch.tensor([2, 2], dtype=torch.int32)):
            torch.testing.assert_close(lm(x, logits_to_keep=keep).logits, full[:, keep.long()])
        torch.testing.assert_close(lm(x, logits_to_keep=2).logits, full[:, -2:])


@pytest.mark.parametrize("kw,message", [
    (dict(logits_to_keep=torch.tensor([[0, 1]])), r"logits_to_keep as a tensor must be 1-D integer positions"),
    (dict(logits_to_keep=torch.tensor([0.0])), r"logits_to_keep as a tensor must be 1-D integer positions"),
    (dict(logits_to_keep=torch.tensor([7])), r"logits_to_keep: positions must be in \[-7, 7\).*max 7"),
    (dict(logits_to_keep=1, labels=ids(2, 7)), r"labels need the logits of every position, but logits_to_keep "
                                               r"keeps the last 1 of 7 positions; pass logits_to_keep=0"),
    (dict(logits_to_keep=torch.tensor([1]), labels=ids(2, 7)), r"labels need the logits of every position"),
])
def test_bad_logits_to_keep_is_named(kw, message):
    """A bad tensor, or one that drops positions a loss needs (GPT-2: a batch-size mismatch naming neither)."""
    with pytest.raises(ValueError, match=message), torch.no_grad():
        tiny_lm()(ids(2, 7), **kw)


def test_logits_to_keep_with_labels_keeping_every_position_gives_the_loss():
    lm, x = tiny_lm(), ids(2, 7)
    with torch.no_grad():
        torch.testing.assert_close(lm(x, labels=x, logits_to_keep=7).loss, lm(x, labels=x).loss)

"""Generation past the context (``GPT.generate(context="slide")``): every registered variant must give exactly
what re-running the model on the last ``block_size`` tokens gives (nanoGPT's crop), with and without the cache,
with learned and rotary positions, for sampled and greedy decoding and for left-padded batches."""

import pytest
import torch

from coupled_qk import GPT, GPTConfig
from coupled_qk.models.generation import sample_next_token
from coupled_qk.models.registry import variant_names
from coupled_qk.models.specs import variant_overrides

BLOCK = 8


def _model(variant: str, position: str = "learned", seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    cfg = GPTConfig(
        vocab_size=23,
        block_size=BLOCK,
        n_layer=1,
        d_model=16,
        n_heads=2,
        position=position,
        **variant_overrides(variant),
    )
    model = GPT(cfg).eval()
    with torch.no_grad():  # a non-trivial map (dt = 0 at init would make some maps the identity)
        for name, p in model.named_parameters():
            if name.endswith(".dt") or "lambda" in name:
                p.add_(0.3)
    return model


def _reference(model: GPT, prompt: torch.Tensor, n: int, temperature: float, top_k, seed: int) -> torch.Tensor:
    """Independent: the whole forward pass on the cropped window before every token (no cache)."""
    g = torch.Generator().manual_seed(seed)
    seq = prompt
    for _ in range(n):
        logits = model(seq[:, -BLOCK:])[:, -1, :].float()
        seq = torch.cat([seq, sample_next_token(logits, temperature, top_k, g)], dim=1)
    return seq


@pytest.mark.parametrize("variant", variant_names())
def test_sliding_equals_rerunning_on_the_last_block_for_every_variant(variant):
    model = _model(variant)
    prompt = torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])
    ref = _reference(model, prompt, 10, 0.0, None, 0)
    assert ref.shape == (2, 15)
    for use_cache in (True, False):
        out = model.generate(prompt, 10, temperature=0, use_cache=use_cache)
        assert torch.equal(out, ref), (variant, use_cache)
    # sampled: the same draws as the reference, token for token
    sampled = model.generate(prompt, 10, temperature=1.3, top_k=7, generator=torch.Generator().manual_seed(4))
    assert torch.equal(sampled, _reference(model, prompt, 10, 1.3, 7, 4)), variant


@pytest.mark.parametrize("variant", ["standard", "coupled", "coupled_differential", "invertible"])
def test_sliding_with_rotary_positions_and_a_prompt_longer_than_the_context(variant):
    model = _model(variant, position="rope", seed=1)
    prompt = torch.arange(11).remainder(23)[None]  # longer than block_size: read through its last 8 tokens
    out = model.generate(prompt, 6, temperature=0)
    assert torch.equal(out[:, :11], prompt)
    assert torch.equal(out, _reference(model, prompt, 6, 0.0, None, 0))


def test_sliding_left_padded_batch_matches_each_prompt_alone():
    model = _model("coupled", seed=2)
    short, long = torch.tensor([7, 8]), torch.tensor([1, 2, 3, 4, 5, 6])
    ids = torch.stack([torch.cat([torch.zeros(4, dtype=torch.long), short]), long])
    mask = torch.tensor([[0, 0, 0, 0, 1, 1], [1, 1, 1, 1, 1, 1]])
    out = model.generate(ids, 12, temperature=0, attention_mask=mask)
    for row, p in enumerate((short, long)):
        alone = model.generate(p[None], 12, temperature=0)
        assert torch.equal(out[row, ids.shape[1] :], alone[0, len(p) :]), row


def test_context_error_keeps_the_old_refusal_and_bad_values_are_named():
    model = _model("standard")
    prompt = torch.zeros(1, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="exceeds block_size=8"):
        model.generate(prompt, 4, context="error")
    with pytest.raises(ValueError, match="context='wrap'"):
        model.generate(prompt, 4, context="wrap")
    assert model.generate(prompt, 3, context="error").shape == (1, 8)  # fits: no window needed
    with pytest.raises(ValueError, match="attention_mask has shape"):
        model.generate_sliding(prompt, 4, attention_mask=torch.ones(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="token ids"):
        model.generate_sliding(torch.full((1, 9), 23), 2)

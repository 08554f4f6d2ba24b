"""attention_mask in GPT: padded batches equal each sequence alone, for every variant and both position kinds."""

import pytest
import torch

from coupled_qk import GPT, GPTConfig
from coupled_qk.layers.scoring import attention_mask_4d
from coupled_qk.models.registry import VARIANTS, variant_names

# every named variant (every attention is one too): built-in, drop-in or plugin
SPECS = {n: VARIANTS[n] for n in variant_names()}

CASES = [(v, "rope") for v in SPECS] + [("standard", "learned"), ("coupled", "learned"), ("differential", "learned")]


def tiny(variant: str, position: str = "rope", seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    cfg = GPTConfig(
        vocab_size=61,
        block_size=32,
        n_layer=2,
        d_model=32,
        n_heads=4,
        n_kv_heads=2,
        position=position,
        **SPECS[variant],
    )
    return GPT(cfg).eval()


def pad(prompts: list[torch.Tensor], side: str, pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        sl = slice(width - len(p), width) if side == "left" else slice(0, len(p))
        ids[i, sl], mask[i, sl] = p, 1
    return ids, mask


def prompts(seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 61, (n,), generator=g) for n in (3, 9, 6)]


@pytest.mark.parametrize("variant, position", CASES)
def test_padded_logits_equal_each_sequence_alone(variant, position):
    model, ps = tiny(variant, position), prompts()
    with torch.no_grad():
        alone = [model(p[None])[0] for p in ps]
        for side in ("left", "right"):
            ids, mask = pad(ps, side)
            out = model(ids, attention_mask=mask)
            assert torch.isfinite(out).all()  # padded rows attend to themselves: no NaN anywhere
            for i in range(len(ps)):
                torch.testing.assert_close(out[i][mask[i].bool()], alone[i], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("variant, position", CASES)
def test_left_padded_generation_equals_each_prompt_alone(variant, position):
    model, ps = tiny(variant, position), prompts()
    ids, mask = pad(ps, "left")
    cached = model.generate(ids, 7, temperature=0, attention_mask=mask)
    uncached = model.generate(ids, 7, temperature=0, attention_mask=mask, use_cache=False)
    assert torch.equal(cached, uncached)
    for i, p in enumerate(ps):
        alone = model.generate(p[None], 7, temperature=0)[0, len(p) :]
        assert torch.equal(cached[i, ids.shape[1] :], alone)


def test_padding_does_not_change_the_real_tokens_positions():
    # a left-padded row numbers its tokens from 0: explicit position_ids 0..n-1 give the same logits
    model, ps = tiny("coupled"), prompts()
    ids, mask = pad(ps, "left")
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, attention_mask=mask), model(ids, attention_mask=mask, position_ids=pos))
        alone = model(ps[0][None])
        # RoPE is relative: a constant shift keeps the logits, a gap changes them (positions are really used)
        torch.testing.assert_close(model(ps[0][None], position_ids=torch.arange(5, 8)), alone, atol=2e-5, rtol=1e-4)
        assert (model(ps[0][None], position_ids=torch.tensor([0, 1, 5])) - alone).abs().max() > 1e-4


def test_mask_4d_hand_case():
    key_mask = torch.tensor([[False, True, True]])
    m = attention_mask_4d(key_mask, 3, 3)[0, 0]
    expected = torch.tensor(
        [
            [True, False, False],  # the padded query sees only itself
            [False, True, False],
            [False, True, True],
        ]
    )
    assert torch.equal(m, expected)
    m = attention_mask_4d(torch.tensor([[False, True, True, True]]), 1, 4)[0, 0]  # one new query, 3 cached keys
    assert torch.equal(m, torch.tensor([[False, True, True, True]]))
    assert attention_mask_4d(None, 2, 2) is None


def test_mask_errors():
    model = tiny("standard")
    ids = torch.randint(0, 61, (2, 5))
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        model(ids, attention_mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="only 0 .padding. and 1"):
        model(ids, attention_mask=torch.full((2, 5), 2))
    with pytest.raises(ValueError, match="position_ids must have shape"):
        model(ids, position_ids=torch.arange(4))
    with pytest.raises(ValueError, match="position_ids must be in"):
        model(ids, position_ids=torch.arange(30, 35))

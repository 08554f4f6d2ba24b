"""Variant-independent initialisation (issue 25): for one seed, every weight two variants share is identical."""

import pytest
import torch

from coupled_qk import GPT, GPTConfig

PAIRS = [
    ("standard", "coupled"),
    ("standard", "uncoupled_mlp"),
    ("coupled", "uncoupled_mlp"),
    ("standard", "invertible"),
    ("differential", "coupled_differential"),
]


def _build(attention: str, seed: int) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(attention=attention, n_layer=2, d_model=32, n_heads=4, block_size=16, vocab_size=64))


@pytest.mark.parametrize("a,b", PAIRS)
@pytest.mark.parametrize("seed", [0, 7])
def test_shared_weights_are_identical_across_variants(a, b, seed):
    ma, mb = _build(a, seed), _build(b, seed)
    sa, sb = ma.state_dict(), mb.state_dict()
    shared = [k for k in sa if k in sb and sa[k].shape == sb[k].shape]
    own = [k for k in sb if k not in sa]
    assert len(shared) >= 10  # embeddings, projections, MLPs, norms of 2 blocks
    for k in shared:
        assert torch.equal(sa[k], sb[k]), k
    if a.startswith("standard") and b != "standard":
        assert own, "the map adds parameters of its own"


def test_global_stream_is_untouched_by_the_map():
    _build("standard", 3)
    after_standard = torch.rand(4)
    _build("coupled", 3)
    assert torch.equal(torch.rand(4), after_standard)


def test_map_parameters_depend_on_the_seed_and_are_reproducible():
    w = lambda m: m.blocks[0].attn.qk_map.force.w_in.detach().clone()  # noqa: E731
    assert torch.equal(w(_build("coupled", 1)), w(_build("coupled", 1)))
    assert not torch.equal(w(_build("coupled", 1)), w(_build("coupled", 2)))
    # the two layers' maps are not copies of each other
    m = _build("coupled", 1)
    assert not torch.equal(m.blocks[0].attn.qk_map.force.w_in, m.blocks[1].attn.qk_map.force.w_in)

"""The decoding fast path (layers/folded.py, issue 12): one step of the coupled map folded into the projection
equals the unfolded map in float64 for every integrator and head layout, is what single-token decoding uses,
follows weight updates, and leaves every other path alone."""

from __future__ import annotations

import functools

import pytest
import torch

from coupled_qk import GPT, GPTConfig
from coupled_qk.layers.attention import CausalSelfAttention
from coupled_qk.layers.folded import fold_projection, foldable, folded_qkv, weight_checksum
from coupled_qk.models.maps.dynamics import QKDynamics
from coupled_qk.models.maps.query_mlp import QueryMLP
from coupled_qk.ops.heads import expand_kv

D_MODEL, H, DH = 24, 4, 6

LAYOUTS = {  # name -> (n_kv_heads, keys_per_query_head, scoring, shared force)
    "mha": (4, True, "standard", True),
    "gqa-per-head-keys": (2, True, "standard", True),
    "gqa-shared-keys": (2, False, "standard", True),
    "mqa-shared-keys": (1, False, "standard", True),
    "per-head-force": (4, True, "standard", False),
    "differential": (4, True, "differential", True),
    "differential-gqa-shared-keys": (2, False, "differential", True),
}


def make_layer(integrator, layout, dtype=torch.float64):
    n_kv, per_query, scoring, shared_force = LAYOUTS[layout]
    torch.manual_seed(0)
    qk = functools.partial(
        QKDynamics, integrator=integrator, keys_per_query_head=per_query, shared_across_heads=shared_force
    )
    layer = CausalSelfAttention(D_MODEL, H, n_kv, DH, qk_map=qk, scoring=scoring).to(dtype).eval()
    with torch.no_grad():  # distinct steps per head and a force large enough to matter
        layer.qk_map.dt.copy_(torch.tensor([0.3, -0.2, 0.5, 0.1]))
        layer.qk_map.force.w_out.mul_(3.0)
    return layer


def unfolded_qkv(layer, x):
    """The ordinary path of CausalSelfAttention.forward up to the map (before RoPE)."""
    b, t, _ = x.shape
    hkv, group = layer.n_kv_heads, layer.head_group
    q, k, v = layer.qkv(x).split([H * DH, hkv * DH, hkv * DH], dim=-1)
    q, k = q.view(b, t, H, DH).transpose(1, 2), k.view(b, t, hkv, DH).transpose(1, 2)
    if layer.keys_per_query_head:
        k = expand_kv(k, layer.n_rep, group)
    q, k = layer.qk_map(q, k)
    return q, k, v.reshape(b * t, -1)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("integrator", ["euler", "leapfrog", "symplectic_euler"])
def test_folded_projection_equals_the_map_in_float64(integrator, layout):
    layer = make_layer(integrator, layout)
    x = torch.randn(3, 5, D_MODEL, dtype=torch.float64)
    q_ref, k_ref, v_ref = unfolded_qkv(layer, x)
    qk, v = folded_qkv(fold_projection(layer), x)  # q' | k' side by side (RoPE rotates them in one call)
    q, k = qk[:, : H * DH], qk[:, H * DH :]
    b, t = x.shape[:2]
    q = q.reshape(b, t, H, DH).transpose(1, 2)
    k = k.reshape(b, t, -1, DH).transpose(1, 2)
    assert k.shape == k_ref.shape  # the cache layout: H keys per query head, n_kv_heads when shared
    torch.testing.assert_close(q, q_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(k, k_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(v, v_ref, rtol=1e-12, atol=1e-12)
    # the map is far from the identity here, so the equality above is not the trivial dt = 0 case
    assert (q - layer.qkv(x)[..., : H * DH].view(b, t, H, DH).transpose(1, 2)).abs().max() > 1e-2


def make_model(attention="coupled", integrator="leapfrog", position="rope", **qk_map):
    """A 2-layer GQA model whose map moves the logits by O(0.1-1) (scaled projections and force), so that a
    stale or wrong fold cannot hide inside the 1e-5 tolerance."""
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=41,
        block_size=16,
        n_layer=2,
        d_model=32,
        n_heads=4,
        n_kv_heads=2,
        attention=attention,
        position=position,
        qk_map={"dt_init": 0.3, "integrator": integrator, **qk_map} if attention == "coupled" else None,
    )
    model = GPT(cfg).eval()
    with torch.no_grad():
        for b in model.blocks:
            b.attn.qkv.weight.mul_(15)
            b.attn.out_proj.weight.mul_(10)
            if hasattr(b.attn.qk_map, "force"):
                b.attn.qk_map.force.w_out.mul_(2)
    return model


def greedy_logits(model, idx, fold=True, cache=None):
    """Logits of a 1-token-at-a-time cached pass over ``idx`` (B, T): (B, T, V)."""
    for block in model.blocks:
        block.attn.fold_inference = fold
    cache = model.new_cache() if cache is None else cache
    with torch.no_grad():
        return torch.cat([model(idx[:, t : t + 1], cache) for t in range(idx.shape[1])], 1)


IDX = torch.randint(0, 41, (2, 8), generator=torch.Generator().manual_seed(1))


def test_the_map_matters_in_these_models():
    model = make_model()
    with torch.no_grad():
        full = model(IDX)
        for b in model.blocks:
            b.attn.qk_map.dt.zero_()
        assert (model(IDX) - full).abs().max() > 0.1


def test_decoding_uses_the_fold_and_rebuilds_it_after_a_weight_update():
    model = make_model()
    with torch.no_grad():
        full = model(IDX)
    attn = [b.attn for b in model.blocks]
    assert all(a._fold is None for a in attn)  # the training-style forward never folds
    cache = model.new_cache()
    torch.testing.assert_close(greedy_logits(model, IDX, cache=cache), full, rtol=1e-5, atol=1e-5)
    assert all(cache.folds[i] is a._fold for i, a in enumerate(attn))
    keys = [a._fold.key for a in attn]
    # an in-place optimizer step changes the weights the fold was built from: the next decode rebuilds it
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model.train()
    model.loss(IDX[:, :-1], IDX[:, 1:]).backward()
    opt.step()
    model.eval()
    with torch.no_grad():
        full2 = model(IDX)
    assert (full2 - full).abs().max() > 1e-3
    torch.testing.assert_close(greedy_logits(model, IDX), full2, rtol=1e-5, atol=1e-5)
    assert [a._fold.key for a in attn] != keys
    # and the unfolded path (fold_inference=False) gives the same logits
    torch.testing.assert_close(greedy_logits(model, IDX, fold=False), full2, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("position", ["rope", "learned"])
@pytest.mark.parametrize("integrator", ["euler", "leapfrog", "symplectic_euler"])
def test_folded_decoding_equals_the_full_forward(integrator, position):
    """The fold hands q' | k' on side by side, rotated by one RoPE call (none with learned positions): cached
    single-token decoding through it equals the full forward of every integrator, over a batch of two (so the
    in-place kick writes into a strided column block)."""
    model = make_model(integrator=integrator, position=position)
    with torch.no_grad():
        full = model(IDX)
    cache = model.new_cache()
    torch.testing.assert_close(greedy_logits(model, IDX, cache=cache), full, rtol=1e-5, atol=1e-5)
    assert all(fold is not None for fold in cache.folds.values()) and len(cache.folds) == 2


@pytest.mark.parametrize("integrator", ["euler", "leapfrog", "symplectic_euler"])
def test_folded_decoding_under_autocast_matches_the_unfolded_path(integrator):
    """Under ``torch.autocast`` (bf16 on CPU) the fold's product is bf16 while its kicks are stored in the weights'
    float32: they are cast, so decoding runs and agrees with the unfolded map to bf16 rounding (it raised a dtype
    error when a kick was added in place unconverted)."""
    model = make_model(integrator=integrator)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        folded, unfolded = greedy_logits(model, IDX), greedy_logits(model, IDX, fold=False)
    assert folded.dtype == torch.bfloat16
    scale = unfolded.float().abs().max()
    assert (folded.float() - unfolded.float()).abs().max() <= 0.03 * scale


def test_the_fold_is_validated_once_per_cache():
    """No per-token check: after its first step a cache only looks its fold up, so a weight change in the middle
    of a generation is not seen by that cache (whose keys are stale anyway); the next cache rebuilds."""
    model = make_model()
    cache = model.new_cache()
    greedy_logits(model, IDX[:, :4], cache=cache)
    old = model.blocks[0].attn._fold
    with torch.no_grad():
        model.blocks[0].attn.qk_map.dt.mul_(-1.0)  # a versioned in-place write
    greedy_logits(model, IDX[:, 4:], cache=cache)
    assert cache.folds[0] is old and model.blocks[0].attn._fold is old
    with torch.no_grad():
        full = model(IDX)
    torch.testing.assert_close(greedy_logits(model, IDX), full, rtol=1e-5, atol=1e-5)
    assert model.blocks[0].attn._fold is not old


@pytest.mark.parametrize("write", ["data", "fused_adamw"])
def test_writes_that_bypass_the_version_counter_are_caught_by_the_next_cache(write):
    """``.data`` writes and fused optimizers change weights without a version bump: the next generation (a
    new cache) compares the checksum and rebuilds."""
    model = make_model()
    greedy_logits(model, IDX)
    old = model.blocks[0].attn._fold
    if write == "data":
        model.blocks[0].attn.qk_map.dt.data.mul_(-1.0)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
        model.loss(IDX[:, :-1], IDX[:, 1:]).backward()
        opt.step()
    assert model.blocks[0].attn._fold.key == old.key  # the version key alone does not see it
    with torch.no_grad():
        full = model(IDX)
    torch.testing.assert_close(greedy_logits(model, IDX), full, rtol=1e-5, atol=1e-5)
    assert model.blocks[0].attn._fold is not old


def test_an_unchanged_model_reuses_its_fold_across_caches():
    model = make_model()
    greedy_logits(model, IDX)
    folds = [b.attn._fold for b in model.blocks]
    greedy_logits(model, IDX)
    assert [b.attn._fold for b in model.blocks] == folds and all(f is not None for f in folds)


def test_fold_follows_load_state_dict_assignment_and_dtype_conversion():
    model, other = make_model(), make_model()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.1 * torch.randn_like(p))
    greedy_logits(model, IDX)  # builds the folds
    model.load_state_dict(other.state_dict())  # in-place copies
    with torch.no_grad():
        torch.testing.assert_close(greedy_logits(model, IDX), other(IDX), rtol=1e-5, atol=1e-5)
    model.load_state_dict(make_model().state_dict(), assign=True)  # new parameter objects
    with torch.no_grad():
        torch.testing.assert_close(greedy_logits(model, IDX), make_model()(IDX), rtol=1e-5, atol=1e-5)
        model.blocks[0].attn.qk_map.dt = torch.nn.Parameter(torch.zeros(4))  # a replaced step size
        torch.testing.assert_close(greedy_logits(model, IDX), model(IDX), rtol=1e-5, atol=1e-5)
        model.blocks[0].attn.qk_map.dt = torch.nn.Parameter(torch.tensor(0.4))  # a scalar step (dt broadcast)
        torch.testing.assert_close(greedy_logits(model, IDX), model(IDX), rtol=1e-5, atol=1e-5)
    model.double()
    with torch.no_grad():
        out = greedy_logits(model, IDX)
        assert out.dtype == torch.float64 and model.blocks[0].attn._fold.weight.dtype == torch.float64
        torch.testing.assert_close(out, model(IDX), rtol=1e-10, atol=1e-10)


def test_hooks_parametrizations_and_inference_tensors_are_not_folded():
    model = make_model()
    attn = model.blocks[0].attn
    handle = attn.qkv.register_forward_hook(lambda mod, inp, out: 1.5 * out)
    assert not foldable(attn)
    with torch.no_grad():
        torch.testing.assert_close(greedy_logits(model, IDX), model(IDX), rtol=1e-5, atol=1e-5)
    handle.remove()
    assert foldable(attn)
    torch.nn.utils.parametrizations.weight_norm(attn.qk_map.force, "w_out")
    assert not foldable(attn)
    with torch.no_grad():
        torch.testing.assert_close(greedy_logits(model, IDX), model(IDX), rtol=1e-5, atol=1e-5)
    with torch.inference_mode():
        built = make_model()  # parameters are inference tensors: no version counter
        assert not foldable(built.blocks[0].attn)
        torch.testing.assert_close(greedy_logits(built, IDX), built(IDX), rtol=1e-5, atol=1e-5)


def test_the_fold_does_not_travel_with_the_model():
    import copy
    import io
    import pickle

    model = make_model()
    greedy_logits(model, IDX)
    assert model.blocks[0].attn._fold is not None
    assert copy.deepcopy(model).blocks[0].attn._fold is None
    assert pickle.loads(pickle.dumps(model)).blocks[0].attn._fold is None
    assert not any("fold" in k for k in model.state_dict())
    buf = io.BytesIO()
    torch.save(model, buf)
    assert b"kick" not in buf.getvalue()


def test_folding_builds_on_the_parameters_device():
    torch.manual_seed(0)
    layer = CausalSelfAttention(D_MODEL, H, 2, DH, qk_map=functools.partial(QKDynamics, integrator="leapfrog"))
    fp = fold_projection(layer.to("meta"))  # shapes only: every tensor must follow the weights' device
    assert fp.weight.device.type == "meta" and fp.kick.device.type == "meta"


def test_prefill_and_gradient_paths_do_not_fold():
    model = make_model()
    idx = torch.randint(0, 41, (1, 6))
    cache = model.new_cache()
    with torch.no_grad():
        model(idx, cache)  # T > 1: the ordinary path (bit-identical to the uncached forward)
    assert all(b.attn._fold is None for b in model.blocks)
    model(idx[:, :1], model.new_cache())  # gradients enabled: the ordinary path
    assert all(b.attn._fold is None for b in model.blocks)


@pytest.mark.parametrize("qk_map", [{"n_steps": 2}, {"n_steps": 0}, {"force": "gradient"}, None])
def test_maps_that_do_not_fold_decode_through_the_ordinary_path(qk_map):
    if qk_map is None:
        model = make_model("uncoupled_mlp")
        assert isinstance(model.blocks[0].attn.qk_map, QueryMLP)
    else:
        model = make_model(**qk_map)
    assert not foldable(model.blocks[0].attn)
    for build in (fold_projection, weight_checksum):  # weight_checksum failed iterating None (a TypeError)
        with pytest.raises(ValueError, match=r"(?s)qk_map=\w+\(.*cannot be folded"):
            build(model.blocks[0].attn)
    with torch.no_grad():
        full = model(IDX)
    torch.testing.assert_close(greedy_logits(model, IDX), full, rtol=1e-5, atol=1e-5)
    assert all(b.attn._fold is None for b in model.blocks)


def test_post_rope_map_does_not_fold():
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=41, block_size=16, n_layer=1, d_model=32, n_heads=4, attention="coupled", map_position="post_rope"
    )
    assert not foldable(GPT(cfg).blocks[0].attn)


def test_folding_leaves_the_random_state_alone():
    layer = make_layer("euler", "mha", dtype=torch.float32)
    state = torch.get_rng_state()
    fp = fold_projection(layer)
    assert torch.equal(torch.get_rng_state(), state)
    assert fp.weight.dtype == torch.float32 and fp.kick.dtype == torch.float32

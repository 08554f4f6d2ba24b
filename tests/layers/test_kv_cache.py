"""Preallocated KV cache and cached decoding (issue 12): cached == full forward for every registered attention at
every length up to block_size, no buffer growth while decoding, grouped-query shared keys."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coupled_qk import GPT, GPTConfig, KVCache
from coupled_qk.models.registry import attention_names, get_attention
from coupled_qk.ops.dynamics import integrate_qk
from coupled_qk.ops.heads import expand_kv, group_mean
from coupled_qk.ops.reference import integrate_qk_shared_reference

BLOCK = 12


def make_model(attention, n_kv_heads=2, shared_keys=False, integrator="leapfrog", **kw):
    """A 2-layer model with perturbed map/differential parameters (dt = 0.3 where the map has a step) so
    every path matters."""
    torch.manual_seed(0)
    qk_map = get_attention(attention).qk_map
    options = None
    if qk_map is not None:
        options = {"dt_init": 0.3} if "dt_init" in qk_map.option_names() else {}
        if "integrator" in qk_map.option_names():
            options["integrator"] = integrator
        if shared_keys:
            options["keys_per_query_head"] = False
    unread = shared_keys and n_kv_heads == 4  # keys_per_query_head=False without grouping: refused, as unread
    cfg = GPTConfig(
        vocab_size=53,
        block_size=BLOCK,
        n_layer=2,
        d_model=32,
        n_heads=4,
        n_kv_heads=n_kv_heads,
        attention=attention,
        qk_map={**options, "keys_per_query_head": True} if unread else options,
        **kw,
    )
    if unread:  # what the model would do if it were accepted (the test below: the same as the default)
        object.__setattr__(cfg.qk_map, "keys_per_query_head", False)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lambda_" in name or ".qk_map." in name:  # identity-initialised maps made non-trivial
                p.add_(0.3 * torch.randn_like(p))
    return model


CASES = [(a, False) for a in attention_names()] + [("coupled", True), ("coupled_differential", True)]


@pytest.mark.parametrize("attention, shared_keys", CASES)
def test_cached_decoding_equals_full_forward_at_every_length(attention, shared_keys):
    model = make_model(attention, shared_keys=shared_keys)
    idx = torch.randint(0, 53, (2, BLOCK))
    with torch.no_grad():
        full = model(idx)
        for prompt in (1, 5):  # token by token after a 1- or 5-token prefill, up to block_size
            cache = model.new_cache()
            parts = [model(idx[:, :prompt], cache)]
            ptrs = {id(t): t.data_ptr() for t in cache._k + cache._v}
            parts += [model(idx[:, t : t + 1], cache) for t in range(prompt, BLOCK)]
            assert cache.length == BLOCK
            assert {id(t): t.data_ptr() for t in cache._k + cache._v} == ptrs  # written in place, never regrown
            torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-5, atol=1e-5)


def test_grouped_shared_keys_cache_is_as_small_as_standard():
    sizes = {}
    for name, attention, shared in [
        ("standard", "standard", False),
        ("per_head", "coupled", False),
        ("shared", "coupled", True),
    ]:
        model = make_model(attention, shared_keys=shared)
        cache = model.new_cache()
        with torch.no_grad():
            model(torch.randint(0, 53, (3, 4)), cache)
        sizes[name] = cache.nbytes()
    # 2 layers x (k + v) x B=3 x heads x block_size x d_head=8 x 4 bytes
    assert sizes["standard"] == sizes["shared"] == 2 * 2 * 3 * 2 * BLOCK * 8 * 4
    assert sizes["per_head"] == 2 * 3 * (4 + 2) * BLOCK * 8 * 4  # keys per query head (4), values per kv head


@pytest.mark.parametrize("attention", ["coupled", "coupled_differential"])
@pytest.mark.parametrize("integrator", ["euler", "leapfrog", "symplectic_euler"])
def test_shared_keys_without_grouping_equal_the_default(attention, integrator):
    """Why GPTConfig refuses keys_per_query_head=False without grouped heads (models/field_rules.py): forced past
    the check, it computes exactly what the default computes."""
    kv = 4  # n_kv_heads == n_heads
    a = make_model(attention, n_kv_heads=kv, integrator=integrator)
    b = make_model(attention, n_kv_heads=kv, shared_keys=True, integrator=integrator)
    b.load_state_dict(a.state_dict())
    idx = torch.randint(0, 53, (2, BLOCK))
    with torch.no_grad():
        assert torch.equal(a(idx), b(idx))


@pytest.mark.parametrize("integrator", ["euler", "leapfrog", "symplectic_euler"])
@pytest.mark.parametrize("group", [1, 2])
def test_integrate_qk_shared_keys_match_a_per_head_reference(integrator, group):
    torch.manual_seed(1)
    w1, w2 = torch.randn(6, 4, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float64)

    def force(x):
        return torch.nn.functional.silu(x.to(w1.dtype) @ w1.T) @ w2.T

    n_rep, hk = 3, 2 * group
    q, k = torch.randn(2, hk * n_rep, 5, 4, dtype=torch.float64), torch.randn(2, hk, 5, 4, dtype=torch.float64)
    dt = torch.rand(hk * n_rep, dtype=torch.float64)
    got = integrate_qk(q, k, force, dt, integrator, 1, group)
    want = integrate_qk_shared_reference(q, k, force, dt, integrator, n_rep, group)
    torch.testing.assert_close(got, want)


def test_group_mean_inverts_expand_kv():
    x = torch.randn(2, 4, 3, 5)
    for group in (1, 2):
        torch.testing.assert_close(group_mean(expand_kv(x, 3, group), 3, group), x)
    assert group_mean(torch.arange(6.0), 3).tolist() == [1.0, 4.0]


def test_shared_keys_need_a_shared_force():
    with pytest.raises(ValueError, match="shared_across_heads"):
        GPTConfig(attention="coupled", qk_map={"keys_per_query_head": False, "shared_across_heads": False})


def test_cache_capacity_growth_crop_and_errors():
    cache = KVCache(1)  # no capacity: grows by doubling
    k = torch.randn(1, 2, 20, 4)
    out_k, out_v = cache.update(0, k[:, :, :3], k[:, :, :3])
    for t in range(3, 20):
        out_k, _ = cache.update(0, k[:, :, t : t + 1], k[:, :, t : t + 1])
    assert torch.equal(out_k, k) and cache.length == 20 and cache._k[0].shape[-2] == 32
    cache.crop(5)
    assert cache.length == 5 and torch.equal(cache.layers[0][0], k[:, :, :5])
    fixed = KVCache(1, capacity=4)
    fixed.update(0, k[:, :, :4], k[:, :, :4])
    with pytest.raises(ValueError, match="capacity=4 is full"):
        fixed.update(0, k[:, :, :1], k[:, :, :1])
    with pytest.raises(ValueError, match="do not match"):
        cache.update(0, torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4))
    with pytest.raises(ValueError, match="capacity"):
        GPT(GPTConfig(block_size=8)).new_cache(9)


def test_cached_forward_keeps_gradients():
    model = make_model("coupled")
    idx = torch.randint(0, 53, (1, 6))
    cache = model.new_cache()
    loss = model(idx[:, :3], cache).sum() + model(idx[:, 3:], cache).sum()
    loss.backward()
    ref = make_model("coupled")
    ref(idx).sum().backward()
    for (name, p), r in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-4, atol=1e-5, msg=name)


_SHAPE = st.tuples(*(st.integers(1, 3) for _ in range(5)))  # batch, key heads, value heads, key width, value width


@settings(max_examples=60, deadline=None)
@given(
    first=_SHAPE,
    changed=st.sampled_from(["none", "batch", "key heads", "value heads", "key width", "value width", "dtype"]),
    t=st.integers(1, 3),
    grow=st.booleans(),
)
def test_update_refuses_exactly_what_differs_from_the_cached_tensors(first, changed, t, grow):
    """Generated: after a first update, a second one is accepted iff its batch, heads, widths and dtype equal the
    cached tensors' (any time length); an accepted one returns the concatenation, bit for bit."""
    b, hk, hv, dk, dv = first
    cache = KVCache(1, capacity=None if grow else 8)
    k1, v1 = torch.randn(b, hk, t, dk), torch.randn(b, hv, t, dv)
    cache.update(0, k1, v1)
    b2, hk2, hv2, dk2, dv2 = (
        b + (changed == "batch"),
        hk + (changed == "key heads"),
        hv + (changed == "value heads"),
        dk + (changed == "key width"),
        dv + (changed == "value width"),
    )
    dtype = torch.float64 if changed == "dtype" else torch.float32
    k2, v2 = torch.randn(b2, hk2, 1, dk2, dtype=dtype), torch.randn(b2, hv2, 1, dv2, dtype=dtype)
    if changed != "none":
        with pytest.raises(ValueError, match="do not match the cached"):
            cache.update(0, k2, v2)
        assert cache.length == t  # nothing written
        return
    k, v = cache.update(0, k2, v2)
    assert torch.equal(k, torch.cat([k1, k2], dim=-2)) and torch.equal(v, torch.cat([v1, v2], dim=-2))

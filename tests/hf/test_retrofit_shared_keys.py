"""retrofit(gqa="shared") with a registered map: the ``query_update_is_shift`` contract (coupled_qk.layers.qk_maps).

The shared rule runs the map on (group-mean query, key) and gives every query head of the group the mean query's
displacement. That is the map applied to each query head only when the query update is a shift independent of the
query (the dynamics, the drift plugin); a map whose query update depends on q (query_mlp: ``q + dt g(q)``, was off
by ~1 per coordinate; invertible: ``q exp(s(k)) + t(k)``) is refused instead of silently approximated.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn

transformers = pytest.importorskip("transformers")

from coupled_qk import MapOptions, QKMap, option  # noqa: E402
from coupled_qk.hf import retrofit  # noqa: E402
from coupled_qk.hf.retrofit import couple  # noqa: E402
from coupled_qk.models import registry  # noqa: E402

V = 61


def _llama(n_kv=2, layers=2, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=n_kv,
        max_position_embeddings=64,
        bos_token_id=None,
        eos_token_id=None,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.config._attn_implementation = "eager"
    return model


@pytest.mark.parametrize("qk_map,cls", [("query_mlp", "QueryMLP"), ("invertible", "InvertibleQKCoupling")])
def test_shared_keys_refused_for_a_map_whose_query_update_depends_on_q(qk_map, cls):
    model = _llama()
    with pytest.raises(
        ValueError,
        match=rf"retrofit\(qk_map='{qk_map}', gqa='shared'\): {cls}.query_update_is_shift"
        rf" is False .* all 2 query heads of the group .* use gqa='expand'",
    ):
        retrofit(model, qk_map=qk_map, gqa="shared")
    assert not any(hasattr(m, "qk_dynamics") for m in model.modules())  # refused before any change
    retrofit(_llama(), qk_map=qk_map, gqa="expand")
    retrofit(_llama(n_kv=4), qk_map=qk_map, gqa="shared")  # no grouped keys: nothing is shared


class StringFlag(QKMap):
    query_update_is_shift = "False"  # reads as true

    def __init__(self, d_head: int, n_heads: int, dt_init: float = 0.1):
        super().__init__()
        self.dt = nn.Parameter(torch.full((n_heads,), float(dt_init)))

    def forward(self, q, k):
        return q, k


@dataclasses.dataclass
class DtOptions(MapOptions):
    dt_init: float = option(0.1)


def test_registration_refuses_a_flag_that_is_not_a_bool():
    with registry.isolated():
        with pytest.raises(ValueError, match=r"StringFlag.query_update_is_shift = 'False' must be a bool"):
            registry.register_qk_map("string_flag", "string_flag", StringFlag, DtOptions)
        keys = type("KeysFlag", (StringFlag,), {"query_update_is_shift": False, "keys_per_query_head": 1})
        with pytest.raises(ValueError, match=r"KeysFlag.keys_per_query_head = 1 must be a bool"):
            registry.register_qk_map("keys_flag", "keys_flag", keys, DtOptions)


def _shared_drift(seed=3, gain=2.0):
    rf = retrofit(_llama().double(), qk_map="drift", map_options={"gain": gain}, gqa="shared")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in rf.modules():
            if hasattr(m, "qk_dynamics"):
                m.qk_dynamics.dt.copy_(torch.randn(m.qk_dynamics.dt.shape, generator=g, dtype=torch.float64))
    return rf


def test_shared_drift_is_the_map_per_query_head_float64(drift):
    rf = _shared_drift()
    attn = rf.model.layers[0].self_attn
    dt = attn.qk_dynamics.dt.detach()
    assert dt.shape == (2,)  # one step per key head
    g = torch.Generator().manual_seed(4)
    q, k = (
        torch.randn(2, 4, 5, 8, generator=g, dtype=torch.float64),
        torch.randn(2, 2, 5, 8, generator=g, dtype=torch.float64),
    )
    with torch.no_grad():
        q2, k2 = couple(attn, q, k)
    for h in range(4):  # independent recomputation: query head h reads key head h // 2 and its dt
        torch.testing.assert_close(q2[:, h], q[:, h] + 2.0 * dt[h // 2] * k[:, h // 2], rtol=0, atol=1e-13)
    assert torch.equal(k2, k)
    # the same model retrofitted with one key per query head and each head's dt taken from its group
    ex = retrofit(_llama().double(), qk_map="drift", map_options={"gain": 2.0}, gqa="expand")
    with torch.no_grad():
        for a, b in zip(ex.model.layers, rf.model.layers):
            a.self_attn.qk_dynamics.dt.copy_(b.self_attn.qk_dynamics.dt.repeat_interleave(2))
        x = torch.randint(0, V, (2, 9), generator=g)
        torch.testing.assert_close(rf(x).logits, ex(x).logits, rtol=0, atol=1e-12)


def test_shared_drift_cached_decoding_equals_the_full_forward(drift):
    rf = _shared_drift()
    x = torch.randint(0, V, (2, 10), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full = rf(x).logits
        cache = transformers.DynamicCache(config=rf.config)
        steps = [rf(x[:, :4], cache=cache, use_cache=True).logits]
        for t in range(4, 10):
            steps.append(rf(x[:, t : t + 1], cache=cache, use_cache=True).logits)
        base = _llama().double()(x).logits
    assert cache.layers[0].keys.shape[1] == 2  # one evolved key per key head is cached
    assert (full - base).abs().max() > 1e-3  # the drift moves the logits (far beyond the tolerance below)
    # transformers' eager softmax runs in float32, so float64 logits agree to ~1e-8, not to rounding
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-6)

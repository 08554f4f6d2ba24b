"""Attention variants: causality, fast vs eager, KV-cache parity, Differential Attention vs float64 reference."""

import math

import pytest
import torch
import torch.nn.functional as F

from coupled_qk import ATTENTION_VARIANTS, GPT, GPTConfig, QueryMLP
from coupled_qk.layers.attention import AttentionRecord, CausalSelfAttention
from coupled_qk.layers.differential import differential_lambda_init, differential_split_values
from coupled_qk.layers.scoring import scaled_dot_product
from coupled_qk.models.registry import get_attention
from coupled_qk.ops.reference import rms_norm_reference, rope_reference

POSITIONS = ["rope", "learned"]


def small_model(attention, position="rope", n_kv_heads=2, integrator=None, **kw):
    """A perturbed 2-layer model; map options (dt_init=0.3, ``integrator``) only where the map has them."""
    torch.manual_seed(0)
    qk_map = get_attention(attention).qk_map
    options = {"dt_init": 0.3} if qk_map is not None and "dt_init" in qk_map.option_names() else {}
    if integrator is not None and qk_map is not None and "integrator" in qk_map.option_names():
        options["integrator"] = integrator
    cfg = GPTConfig(
        vocab_size=97,
        block_size=32,
        n_layer=2,
        d_model=32,
        n_heads=4,
        n_kv_heads=n_kv_heads,
        attention=attention,
        position=position,
        **options,
        **kw,
    )
    model = GPT(cfg).eval()
    # make the differential lambda and dynamics non-trivial
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("attention", ATTENTION_VARIANTS)
def test_causality(attention, position):
    model = small_model(attention, position)
    idx = torch.randint(0, 97, (2, 20))
    changed = idx.clone()
    changed[:, 12:] = torch.randint(0, 97, (2, 8))
    with torch.no_grad():
        a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :12], b[:, :12], rtol=0, atol=1e-6)
    assert (a[:, 12:] - b[:, 12:]).abs().max() > 1e-4


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("attention", ATTENTION_VARIANTS)
def test_fast_path_equals_eager(attention, position):
    model = small_model(attention, position)
    idx = torch.randint(0, 97, (2, 24))
    with torch.no_grad():
        fast = model(idx)
        for block in model.blocks:
            block.attn.impl = "eager"
        eager = model(idx)
    torch.testing.assert_close(fast, eager, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(  # map_position only exists for an attention with a query-key map (GPTConfig refuses it)
    "attention, position, map_position",
    [
        (a, p, m)
        for a in ATTENTION_VARIANTS
        for p, m in (("rope", "pre_rope"), ("rope", "post_rope"), ("learned", "pre_rope"))
        if m == "pre_rope" or get_attention(a).qk_map is not None
    ],
)
def test_kv_cache_decoding_matches_full_forward(attention, position, map_position):
    model = small_model(attention, position, map_position=map_position, integrator="leapfrog")
    idx = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache()
        parts = [model(idx[:, :7], cache), model(idx[:, 7:11], cache)]  # prompt, then a chunk
        parts += [model(idx[:, t : t + 1], cache) for t in range(11, 20)]  # then token by token
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attention", ATTENTION_VARIANTS)
def test_generate_with_and_without_cache_agree(attention):
    model = small_model(attention)
    prompt = torch.randint(0, 97, (2, 5))
    a = model.generate(prompt, 10, temperature=0, use_cache=True)
    b = model.generate(prompt, 10, temperature=0, use_cache=False)
    assert a.shape == (2, 15) and torch.equal(a, b) and torch.equal(a[:, :5], prompt)


@pytest.mark.parametrize("change", [{"dt_init": 0.0}, {"n_steps": 0}, {"dt_init": 0.0, "integrator": "leapfrog"}])
def test_coupled_with_dt_zero_or_no_steps_equals_standard(change):
    std = small_model("standard")
    cpl = GPT(GPTConfig(**{**std.config.to_dict(), "attention": "coupled", **change})).eval()
    missing = cpl.load_state_dict(std.state_dict(), strict=False)
    assert missing.missing_keys and all(".qk_map." in name for name in missing.missing_keys)
    idx = torch.randint(0, 97, (3, 30))
    with torch.no_grad():
        assert torch.equal(std(idx), cpl(idx))


@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_differential_attention_matches_float64_reference(n_kv_heads):
    torch.manual_seed(1)
    d_model, n_heads, d_head, layer = 48, 4, 12, 3
    attn = CausalSelfAttention(d_model, n_heads, n_kv_heads, d_head, scoring="differential", layer_idx=layer).double()
    with torch.no_grad():
        attn.scorer.subln.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 9, d_model, dtype=torch.float64)
    from coupled_qk.ops.rope import rope_tables

    out = attn(x, rope_tables(9, d_head, dtype=torch.float64))

    # independent re-implementation of Ye et al. (2024), eq. 1-3, with GQA pairing head i -> kv head i // n_rep
    w = attn.qkv.weight
    wq, wk, wv = (
        w[: n_heads * d_head],
        w[n_heads * d_head : (n_heads + n_kv_heads) * d_head],
        w[(n_heads + n_kv_heads) * d_head :],
    )
    h, rep = n_heads // 2, n_heads // n_kv_heads
    lam_init = 0.8 - 0.6 * math.exp(-0.3 * layer)
    rule = attn.scorer
    lam = (
        torch.exp((rule.lambda_q1 * rule.lambda_k1).sum())
        - torch.exp((rule.lambda_q2 * rule.lambda_k2).sum())
        + lam_init
    )
    heads = []
    mask = torch.ones(9, 9).tril().bool()
    for b in range(2):
        per_head = []
        for i in range(h):
            j = i // rep
            maps = []
            for s in range(2):
                q = rope_reference(x[b] @ wq[(2 * i + s) * d_head : (2 * i + s + 1) * d_head].T)
                k = rope_reference(x[b] @ wk[(2 * j + s) * d_head : (2 * j + s + 1) * d_head].T)
                scores = (q @ k.T / math.sqrt(d_head)).masked_fill(~mask, float("-inf"))
                maps.append(scores.softmax(-1))
            v = x[b] @ wv[j * 2 * d_head : (j + 1) * 2 * d_head].T
            o = (maps[0] - lam * maps[1]) @ v
            per_head.append(rms_norm_reference(o, rule.subln.weight) * (1 - lam_init))
        heads.append(torch.cat(per_head, dim=-1) @ attn.out_proj.weight.T)
    torch.testing.assert_close(out, torch.stack(heads), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_standard_rope_attention_matches_float64_reference(n_kv_heads):
    """Standard attention with RoPE (q and k rotated in one call) against per-head float64 formulas, with
    grouped-query heads (head i reads kv head i // n_rep), a shared position table and per-row positions."""
    torch.manual_seed(2)
    d_model, n_heads, d_head, t = 32, 4, 8, 7
    attn = CausalSelfAttention(d_model, n_heads, n_kv_heads, d_head).double()
    x = torch.randn(2, t, d_model, dtype=torch.float64)
    from coupled_qk.ops.rope import rope_tables

    cos, sin = rope_tables(t + 3, d_head, dtype=torch.float64)
    offsets = [0, 3]  # row b sits at positions offsets[b] .. offsets[b] + t - 1
    pos = torch.stack([torch.arange(o, o + t) for o in offsets])
    outs = {"shared": attn(x, (cos[:t], sin[:t])), "per_row": attn(x, (cos[pos].unsqueeze(1), sin[pos].unsqueeze(1)))}
    w = attn.qkv.weight
    wq, wk, wv = (
        w[: n_heads * d_head],
        w[n_heads * d_head : (n_heads + n_kv_heads) * d_head],
        w[(n_heads + n_kv_heads) * d_head :],
    )
    rep, mask = n_heads // n_kv_heads, torch.ones(t, t).tril().bool()
    for how, out in outs.items():
        rows = []
        for b in range(2):
            start = offsets[b] if how == "per_row" else 0
            heads = []
            for i in range(n_heads):
                j = i // rep
                q = rope_reference(x[b] @ wq[i * d_head : (i + 1) * d_head].T, start=start)
                k = rope_reference(x[b] @ wk[j * d_head : (j + 1) * d_head].T, start=start)
                scores = (q @ k.T / math.sqrt(d_head)).masked_fill(~mask, float("-inf"))
                heads.append(scores.softmax(-1) @ (x[b] @ wv[j * d_head : (j + 1) * d_head].T))
            rows.append(torch.cat(heads, -1) @ attn.out_proj.weight.T)
        torch.testing.assert_close(out, torch.stack(rows), rtol=1e-10, atol=1e-10)


def test_differential_parameter_delta_is_six_d_head_per_layer():
    cfg = dict(vocab_size=101, block_size=16, n_layer=3, d_model=64, n_heads=4)
    std = GPT(GPTConfig(**cfg)).num_parameters()
    diff = GPT(GPTConfig(**cfg, attention="differential")).num_parameters()
    assert diff - std == 3 * 6 * 16
    assert differential_lambda_init(0) == pytest.approx(0.2)


def test_uncoupled_mlp_leaves_keys_untouched_and_matches_formula():
    attn = CausalSelfAttention(16, 4, 2, 8, QueryMLP, use_rope=False).double()
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    _, rec = attn(x, record=True)
    assert isinstance(rec, AttentionRecord) and rec.k.shape == rec.q.shape == (1, 4, 5, 8)  # keys per query head
    assert torch.equal(rec.k_mapped, rec.k)
    q, k, _ = attn.qkv(x).split([32, 16, 16], dim=-1)  # independent: the projections by hand
    q = q.view(1, 5, 4, 8).transpose(1, 2)
    k = k.view(1, 5, 2, 8).transpose(1, 2).repeat_interleave(2, dim=1)
    torch.testing.assert_close(rec.q, q)
    torch.testing.assert_close(rec.k, k)
    g = F.silu(q @ attn.qk_map.mlp.w_in.T) @ attn.qk_map.mlp.w_out.T
    torch.testing.assert_close(rec.q_mapped, q + attn.qk_map.dt.view(-1, 1, 1) * g)
    assert torch.equal(rec.dt, attn.qk_map.dt) and rec.attn2 is None and rec.lam is None


def test_record_of_post_rope_map_holds_the_rotated_inputs():
    from coupled_qk.ops.rope import rope_tables

    torch.manual_seed(0)
    attn = CausalSelfAttention(16, 2, 1, 8, QueryMLP, map_position="post_rope").double()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    _, rec = attn(x, rope_tables(6, 8, dtype=torch.float64), record=True)
    q = attn.qkv(x)[..., :16].view(2, 6, 2, 8).transpose(1, 2)
    torch.testing.assert_close(rec.q, rope_reference(q))  # the map's real input: no re-rotation needed by consumers


def test_recording_returns_probabilities_and_keeps_outputs():
    model = small_model("coupled")
    idx = torch.randint(0, 97, (2, 10))
    with torch.no_grad():
        ref = model(idx)
        traces = list(model.trace(idx))
        out = model.lm_head(model.ln_f(traces[-1].output))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    probs = traces[0].record.attn
    assert probs.shape == (2, 4, 10, 10)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 4, 10))
    assert probs.triu(1).abs().max() == 0
    assert not any(hasattr(b.attn, "recorded") for b in model.blocks)  # nothing left on the model


def test_eager_path_upcasts_half_precision_inputs():
    """Issue 9 F: q = k = 33 in fp16 with d = 64 overflows q k^T in fp16 (69696 > 65504); the eager path must
    return SDPA's finite result (here every score is equal, so each output row is the mean of the values)."""
    q = torch.full((1, 2, 5, 64), 33.0, dtype=torch.float16)
    v = torch.randn(1, 2, 5, 64).to(torch.float16)
    out, probs = scaled_dot_product(q, q.clone(), v, eager=True)
    assert out.dtype == torch.float16 and torch.isfinite(out).all() and probs.dtype == torch.float32
    expected = v.double().cumsum(2) / torch.arange(1, 6, dtype=torch.float64).view(1, 1, 5, 1)
    torch.testing.assert_close(out.double(), expected, rtol=2e-3, atol=2e-3)
    sdpa, _ = scaled_dot_product(q.float(), q.float(), v.float(), eager=False)
    torch.testing.assert_close(out.float(), sdpa, rtol=2e-3, atol=2e-3)


def test_old_state_dicts_load():
    """Checkpoints saved when the maps were attributes ``dynamics``/``query_mlp``/``dt`` of the layer, and when
    Differential Attention's parameters (``lambda_*``, ``subln``) were the layer's own (now its ``scorer``'s;
    tests/models/test_legacy_checkpoints.py loads folders written by that code)."""
    for attention, renames in [
        ("coupled", [("qk_map.", "dynamics.")]),
        ("uncoupled_mlp", [("qk_map.mlp.", "query_mlp."), ("qk_map.dt", "dt")]),
        ("differential", [("scorer.", "")]),
        ("coupled_differential", [("qk_map.", "dynamics."), ("scorer.", "")]),
    ]:
        model = small_model(attention)
        old = {}
        for key, value in model.state_dict().items():
            for new, legacy in renames:
                key = key.replace(new, legacy)
            old[key] = value.clone()
        assert not any("qk_map" in key or "scorer" in key for key in old)
        fresh = GPT(model.config)
        fresh.load_state_dict(old)  # strict
        assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))


def test_bad_attention_arguments():
    with pytest.raises(ValueError, match="scoring='flash'"):
        CausalSelfAttention(16, 2, 2, 8, scoring="flash")
    with pytest.raises(ValueError, match="n_kv_heads=3"):
        CausalSelfAttention(16, 4, 3, 4)
    with pytest.raises(ValueError, match="even"):
        CausalSelfAttention(16, 3, 3, 4, scoring="differential")


@pytest.mark.parametrize("n_kv_heads", [4, 2])
@pytest.mark.parametrize("attention", ["differential", "coupled_differential"])
def test_differential_split_values_equals_full_width_values(attention, n_kv_heads):
    """Issue 28 item 5: the flash-eligible split-value path (forced on CPU) equals the full-width path in
    outputs and gradients, with and without padding and with a KV cache."""
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=61, block_size=16, n_layer=2, d_model=32, n_heads=4, n_kv_heads=n_kv_heads, attention=attention
    )
    model = GPT(cfg).double()
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.scorer.subln.weight.uniform_(0.5, 1.5)
    idx = torch.randint(0, 61, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :3] = 0
    outs, grads = [], []
    for split in (False, True):
        for blk in model.blocks:
            blk.attn.scorer.split_values = split
        model.zero_grad()
        out = model(idx, attention_mask=mask)
        (out.sin() * torch.linspace(-1, 1, 61, dtype=torch.float64)).sum().backward()
        outs.append(out.detach())
        grads.append([p.grad.clone() for p in model.parameters()])
        with torch.no_grad():  # cached decoding through the split path
            cache = model.new_cache()
            step = torch.cat([model(idx[:, :8], cache), model(idx[:, 8:9], cache)], dim=1)
            torch.testing.assert_close(step, model(idx[:, :9]), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-12, atol=1e-12)
    for g1, g0 in zip(grads[1], grads[0]):
        torch.testing.assert_close(g1, g0, rtol=1e-10, atol=1e-12)
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 1, 5, 16)
    y1, y2 = differential_split_values(q, k, v)
    assert y1.shape == y2.shape == (2, 2, 5, 16)
    torch.testing.assert_close(y1, scaled_dot_product(q[:, 0::2], k[:, 0::2], v, True)[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(y2, scaled_dot_product(q[:, 1::2], k[:, 1::2], v, True)[0], rtol=1e-5, atol=1e-6)


def test_differential_split_values_defaults_to_cuda_only():
    rule = CausalSelfAttention(32, 4, 4, 8, scoring="differential").scorer
    assert rule.split_values is None
    assert not rule.uses_split_values(torch.zeros(1, device="cpu"))
    assert rule.uses_split_values(torch.zeros(1, device="meta")) is False
    rule.split_values = True
    assert rule.uses_split_values(torch.zeros(1))


def test_differential_rmsnorm_runs_in_float32_under_bf16_autocast():
    """Issue 28 item 5: under autocast the sub-layer norm gets a float32 input (its weight's dtype), not bf16,
    and the layer still returns bf16; in float32 the output is unchanged (no casts)."""
    torch.manual_seed(0)
    attn = CausalSelfAttention(32, 4, 4, 8, scoring="differential", layer_idx=1)
    seen = []
    attn.scorer.subln.register_forward_hook(lambda m, inp, out: seen.append((inp[0].dtype, out.dtype)))
    x = torch.randn(2, 6, 32)
    from coupled_qk.ops.rope import rope_tables

    cos, sin = rope_tables(6, 8, 10000.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = attn(x, (cos, sin))
    assert seen[-1] == (torch.float32, torch.float32)
    assert y.dtype == torch.bfloat16
    y32 = attn(x, (cos, sin))
    assert seen[-1] == (torch.float32, torch.float32) and y32.dtype == torch.float32
    torch.testing.assert_close(y.float(), y32, rtol=0.05, atol=0.02)


def test_a_scoring_rule_without_probabilities_when_eager_is_named_when_recording():
    from coupled_qk.layers.scoring import ScoringRule

    class NoProbs(ScoringRule):
        def __init__(self, d_head, n_heads, layer_idx):
            super().__init__()

        def forward(self, q, k, v, eager, dropout_p=0.0, mask=None):
            return scaled_dot_product(q, k, v, False, dropout_p, mask)[0], None

    attn = CausalSelfAttention(16, 2, 2, 8, scoring=NoProbs, use_rope=False)
    x = torch.randn(1, 5, 16)
    assert attn(x).shape == (1, 5, 16)  # fine where no probabilities are read
    with pytest.raises(ValueError, match=r"scoring rule NoProbs returned probabilities None with eager=True"):
        attn(x, record=True)  # was AttributeError: 'NoneType' object has no attribute 'shape' in the diagnostics

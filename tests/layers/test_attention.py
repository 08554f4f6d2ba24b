"""Attention variants: causality, fast vs eager, KV-cache parity, Differential Attention vs float64 reference."""

import math

import pytest
import torch
import torch.nn.functional as F

from coupled_qk import ATTENTION_VARIANTS, GPT, GPTConfig
from coupled_qk.layers.attention import CausalSelfAttention, differential_lambda_init

POSITIONS = ["rope", "learned"]


def small_model(attention, position="rope", n_kv_heads=2, **kw):
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=97, block_size=32, n_layer=2, d_model=32, n_heads=4, n_kv_heads=n_kv_heads,
        attention=attention, position=position, dt_init=0.3, **kw,
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


@pytest.mark.parametrize(
    "position, dynamics_position", [("rope", "pre_rope"), ("rope", "post_rope"), ("learned", "pre_rope")]
)
@pytest.mark.parametrize("attention", ATTENTION_VARIANTS)
def test_kv_cache_decoding_matches_full_forward(attention, position, dynamics_position):
    model = small_model(attention, position, dynamics_position=dynamics_position, integrator="leapfrog")
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
    assert all("dynamics" in name for name in missing.missing_keys)
    idx = torch.randint(0, 97, (3, 30))
    with torch.no_grad():
        assert torch.equal(std(idx), cpl(idx))


def rms_norm(x, weight, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope64(x, base=10000.0):
    t, d = x.shape[-2], x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(t, dtype=torch.float64)[:, None] * inv[None]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    c, s = ang.cos(), ang.sin()
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_differential_attention_matches_float64_reference(n_kv_heads):
    torch.manual_seed(1)
    d_model, n_heads, d_head, layer = 48, 4, 12, 3
    attn = CausalSelfAttention(d_model, n_heads, n_kv_heads, d_head, "differential", layer_idx=layer).double()
    with torch.no_grad():
        attn.subln.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 9, d_model, dtype=torch.float64)
    from coupled_qk.ops.rope import rope_tables

    out = attn(x, rope_tables(9, d_head, dtype=torch.float64))

    # independent re-implementation of Ye et al. (2024), eq. 1-3, with GQA pairing head i -> kv head i // n_rep
    w = attn.qkv.weight
    wq, wk, wv = w[: n_heads * d_head], w[n_heads * d_head : (n_heads + n_kv_heads) * d_head], w[(n_heads + n_kv_heads) * d_head :]
    h, rep = n_heads // 2, n_heads // n_kv_heads
    lam_init = 0.8 - 0.6 * math.exp(-0.3 * layer)
    lam = (
        torch.exp((attn.lambda_q1 * attn.lambda_k1).sum()) - torch.exp((attn.lambda_q2 * attn.lambda_k2).sum()) + lam_init
    )
    heads = []
    mask = torch.ones(9, 9).tril().bool()
    for b in range(2):
        per_head = []
        for i in range(h):
            j = i // rep
            maps = []
            for s in range(2):
                q = rope64(x[b] @ wq[(2 * i + s) * d_head : (2 * i + s + 1) * d_head].T)
                k = rope64(x[b] @ wk[(2 * j + s) * d_head : (2 * j + s + 1) * d_head].T)
                scores = (q @ k.T / math.sqrt(d_head)).masked_fill(~mask, float("-inf"))
                maps.append(scores.softmax(-1))
            v = x[b] @ wv[j * 2 * d_head : (j + 1) * 2 * d_head].T
            o = (maps[0] - lam * maps[1]) @ v
            per_head.append(rms_norm(o, attn.subln.weight) * (1 - lam_init))
        heads.append(torch.cat(per_head, dim=-1) @ attn.out_proj.weight.T)
    torch.testing.assert_close(out, torch.stack(heads), rtol=1e-10, atol=1e-10)


def test_differential_parameter_delta_is_six_d_head_per_layer():
    cfg = dict(vocab_size=101, block_size=16, n_layer=3, d_model=64, n_heads=4)
    std = GPT(GPTConfig(**cfg)).num_parameters()
    diff = GPT(GPTConfig(**cfg, attention="differential")).num_parameters()
    assert diff - std == 3 * 6 * 16
    assert differential_lambda_init(0) == pytest.approx(0.2)


def test_uncoupled_mlp_leaves_keys_untouched_and_matches_formula():
    attn = CausalSelfAttention(16, 2, 2, 8, "uncoupled_mlp", use_rope=False).double()
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    attn.record = True
    attn(x)
    rec = attn.recorded
    assert torch.equal(rec["k_evolved"], rec["k"])
    g = F.silu(rec["q"] @ attn.query_mlp.w_in.T) @ attn.query_mlp.w_out.T
    torch.testing.assert_close(rec["q_evolved"], rec["q"] + attn.dt.view(-1, 1, 1) * g)


def test_recording_returns_probabilities_and_keeps_outputs():
    model = small_model("coupled")
    idx = torch.randint(0, 97, (2, 10))
    with torch.no_grad():
        ref = model(idx)
        for block in model.blocks:
            block.attn.record = True
        out = model(idx)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    probs = model.blocks[0].attn.recorded["attn"]
    assert probs.shape == (2, 4, 10, 10)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 4, 10))
    assert probs.triu(1).abs().max() == 0


def test_bad_attention_arguments():
    with pytest.raises(ValueError, match="attention='flash'"):
        CausalSelfAttention(16, 2, 2, 8, "flash")
    with pytest.raises(ValueError, match="n_kv_heads=3"):
        CausalSelfAttention(16, 4, 3, 4)
    with pytest.raises(ValueError, match="even"):
        CausalSelfAttention(16, 3, 3, 4, "differential")

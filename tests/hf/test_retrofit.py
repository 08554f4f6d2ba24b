"""Retrofitting coupled QK dynamics into transformers causal LMs (coupled_qk.hf.retrofit).

Small randomly initialised models built from transformers config classes; nothing is downloaded.
"""

from __future__ import annotations

import copy
import logging
import math

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

from coupled_qk import GPT, GPTConfig  # noqa: E402
from coupled_qk.hf import load_retrofitted, retrofit  # noqa: E402
from coupled_qk.hf.gpt2_export import gpt_to_gpt2  # noqa: E402
from coupled_qk.hf.retrofit import coupling_parameters, step_sizes  # noqa: E402
from coupled_qk.ops.rope import apply_rope, rope_tables  # noqa: E402

V = 61
_SMALL = dict(
    vocab_size=V,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    bos_token_id=None,
    eos_token_id=None,
)
FAMILIES = {
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**_SMALL)),
    "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(**_SMALL)),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**_SMALL)),
    "qwen3": lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**_SMALL, head_dim=8)),
    "gpt2": lambda: transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=None, eos_token_id=None
        )
    ),
}
# every family and GQA mode with the eager backend; sdpa (which runs GQA natively) on a subset
CASES = [(f, g, "eager") for f in FAMILIES for g in (("expand", "shared") if f != "gpt2" else ("expand",))]
CASES += [("llama", "expand", "sdpa"), ("qwen3", "shared", "sdpa"), ("gpt2", "expand", "sdpa")]


def _model(family: str, impl: str = "sdpa", seed: int = 0):
    torch.manual_seed(seed)
    model = FAMILIES[family]()
    model.config._attn_implementation = impl
    return model.eval()


def _greedy(model, prompt, n, use_cache=True):
    return model.generate(prompt, max_new_tokens=n, do_sample=False, use_cache=use_cache, pad_token_id=0)


def _greedy_by_full_forward(model, prompt, n):
    out = prompt
    with torch.no_grad():
        for _ in range(n):
            out = torch.cat([out, model(out).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return out


def _set_dt(model, scale=0.4, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for dt in (m.dt for m in model.modules() if hasattr(m, "dt") and hasattr(m, "force")):
            dt.copy_(scale * torch.randn(dt.shape, generator=g))


@pytest.mark.parametrize("family,gqa,impl", CASES)
def test_dt0_keeps_logits_and_cached_generation_identical(family, gqa, impl):
    model = _model(family, impl)
    x = torch.randint(0, V, (2, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = model(x).logits
    ref_gen = _greedy(model, x[:, :4], 6)
    rf = retrofit(copy.deepcopy(model), gqa=gqa)
    with torch.no_grad():
        assert torch.equal(rf(x).logits, ref)
    assert torch.equal(_greedy(rf, x[:, :4], 6), ref_gen)
    assert len(coupling_parameters(rf)) == 3 * 2  # dt, force.w_in, force.w_out in each of 2 layers
    assert all(torch.equal(dt, torch.zeros_like(dt)) for dt in step_sizes(rf))


def _llama_attention_reference(attn, x, dt, w_in, w_out, gqa, base):
    """Float64 re-derivation of one coupled Llama attention layer (pre-RoPE Euler, one step)."""
    b, t, _ = x.shape
    h, g, d = attn.config.num_attention_heads, attn.config.num_key_value_heads, attn.head_dim
    r = h // g
    q = (x @ attn.q_proj.weight.T).view(b, t, h, d).transpose(1, 2)
    k = (x @ attn.k_proj.weight.T).view(b, t, g, d).transpose(1, 2)
    v = (x @ attn.v_proj.weight.T).view(b, t, g, d).transpose(1, 2).repeat_interleave(r, dim=1)

    def f(z):
        return F.silu(z @ w_in.T) @ w_out.T

    if gqa == "expand":
        k = k.repeat_interleave(r, dim=1)
        dth = dt.view(h, 1, 1)
        q, k = q + dth * k, k + dth * f(q)
    else:
        qm = q.view(b, g, r, t, d).mean(2)
        dtg = dt.view(g, 1, 1)
        q = q + (dtg * k).repeat_interleave(r, dim=1)
        k = (k + dtg * f(qm)).repeat_interleave(r, dim=1)
    cos, sin = rope_tables(t, d, base, dtype=torch.float64)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, h * d)
    return y @ attn.o_proj.weight.T


@pytest.mark.parametrize("gqa", ["expand", "shared"])
def test_coupled_llama_attention_matches_float64_reference(gqa):
    model = retrofit(_model("llama", "eager").double(), gqa=gqa)
    _set_dt(model)
    attn = model.model.layers[0].self_attn
    seen = {}
    attn.register_forward_hook(lambda m, a, kw, out: seen.update(x=kw["hidden_states"], y=out[0]), with_kwargs=True)
    with torch.no_grad():
        model(torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(3)))
    dyn = attn.qk_dynamics
    assert dyn.dt.shape == ((4,) if gqa == "expand" else (2,))
    ref = _llama_attention_reference(
        attn, seen["x"], dyn.dt, dyn.force.w_in, dyn.force.w_out, gqa, model.config.rope_parameters["rope_theta"]
    )
    # transformers computes its RoPE tables in float32, hence the float32-level tolerance
    torch.testing.assert_close(seen["y"], ref, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(ref, attn.o_proj(torch.zeros_like(seen["y"])))  # non-trivial output


@pytest.mark.parametrize("attention", ["standard", "coupled"])
def test_gpt2_export_matches_our_gpt(attention):
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=V, block_size=32, n_layer=2, d_model=32, n_heads=4, position="learned", attention=attention
    )
    ours = GPT(cfg).eval()
    if attention == "coupled":
        _set_dt(ours)
    hf = gpt_to_gpt2(ours)
    x = torch.randint(0, V, (2, 17), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, ours(x), rtol=1e-5, atol=1e-5)
    prompt = x[:, :5]
    assert torch.equal(_greedy(hf, prompt, 8), ours.generate(prompt, 8, temperature=0))


def test_gpt2_export_refuses_rope_models():
    with pytest.raises(ValueError, match="position='rope'"):
        gpt_to_gpt2(GPT(GPTConfig(vocab_size=V, block_size=16, n_layer=1, d_model=16, n_heads=2)))


def _train(model, steps=4, lr=3e-2, seed=5):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        x = torch.randint(0, V, (4, 16), generator=g)
        loss = model(x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.mark.parametrize(
    "family,gqa,position",
    [
        ("llama", "expand", "pre_rope"),
        ("qwen3", "shared", "pre_rope"),
        ("mistral", "expand", "post_rope"),
        ("qwen2", "shared", "post_rope"),
        ("gpt2", "expand", "pre_rope"),
    ],
)
def test_training_moves_dt_and_cached_decoding_stays_exact(family, gqa, position):
    model = retrofit(_model(family), gqa=gqa, position=position)
    _train(model)
    assert all(dt.abs().min() > 0 for dt in step_sizes(model))  # every head's dt has moved from 0
    x = torch.randint(0, V, (2, 14), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        full = model(x).logits
        cache = transformers.DynamicCache(config=model.config)
        parts = [model(x[:, :6], cache=cache, use_cache=True).logits]
        for i in range(6, 14):
            parts.append(model(x[:, i : i + 1], cache=cache, use_cache=True).logits)
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)
    prompt = x[:, :4]
    cached = _greedy(model, prompt, 8)
    assert torch.equal(cached, _greedy(model, prompt, 8, use_cache=False))
    assert torch.equal(cached, _greedy_by_full_forward(model, prompt, 8))


def test_freeze_base_trains_only_the_coupling():
    model = retrofit(_model("llama"), freeze_base=True, dt_init=0.0)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".qk_dynamics." in n for n in trainable)
    assert len(trainable) == 3 * 2  # dt, force.w_in, force.w_out per layer
    before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    _train(model)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters() if not p.requires_grad)
    assert all(dt.abs().min() > 0 for dt in step_sizes(model))


def test_save_and_load_retrofitted(tmp_path):
    model = retrofit(_model("qwen2"), gqa="shared", integrator="leapfrog")
    _set_dt(model)
    model.save_pretrained(tmp_path)
    loaded = load_retrofitted(tmp_path).eval()
    assert loaded.config.coupled_qk_retrofit["integrator"] == "leapfrog"
    x = torch.randint(0, V, (1, 9))
    with torch.no_grad():
        assert torch.equal(loaded(x).logits, model(x).logits)


def test_load_retrofitted_reports_no_coupling_weights_as_unexpected(tmp_path, caplog):
    # the base load must not log transformers' "UNEXPECTED" report for the coupling weights it then loads
    model = retrofit(_model("llama"))
    _set_dt(model)
    model.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING):
        loaded = load_retrofitted(tmp_path).eval()
    assert "qk_dynamics" not in caplog.text and "UNEXPECTED" not in caplog.text, caplog.text
    assert type(loaded) is transformers.LlamaForCausalLM
    x = torch.randint(0, V, (1, 9))
    with torch.no_grad():
        assert torch.equal(loaded(x).logits, model(x).logits)


def test_clear_errors():
    torch.manual_seed(0)
    neox = transformers.GPTNeoXForCausalLM(
        transformers.GPTNeoXConfig(
            vocab_size=V, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48
        )
    )
    with pytest.raises(ValueError, match="retrofit supports attention classes .*GPTNeoXAttention"):
        retrofit(neox)
    model = _model("llama")
    with pytest.raises(ValueError, match="gqa='per-group' is unknown"):
        retrofit(model, gqa="per-group")
    with pytest.raises(ValueError, match="integrator"):
        retrofit(_model("llama"), integrator="rk4")
    retrofit(model)
    with pytest.raises(ValueError, match="already retrofitted"):
        retrofit(model)
    static = transformers.StaticCache(config=model.config, max_cache_len=16)
    with pytest.raises(ValueError, match="static cache"):
        model(torch.zeros(1, 3, dtype=torch.long), cache=static, use_cache=True)


def test_load_retrofitted_from_a_base_model_folder(tmp_path):
    # the docstring admits base models (GPT2Model, LlamaModel); their saved keys lack the causal LM's prefix and
    # load_retrofitted said the folder "lacks coupling weights" although they were there
    for family, lm in (("gpt2", lambda m: m.transformer), ("llama", lambda m: m.model)):
        full = _model(family)
        base = retrofit(lm(full), dt_init=0.3, integrator="symplectic_euler")
        base.save_pretrained(tmp_path / family)
        loaded = load_retrofitted(tmp_path / family).eval()
        assert [dt.tolist() for dt in step_sizes(loaded)] == [dt.tolist() for dt in step_sizes(base)]
        x = torch.randint(0, V, (1, 9))
        with torch.no_grad():
            assert torch.equal(lm(loaded)(x).last_hidden_state, base(x).last_hidden_state)


@pytest.mark.parametrize(
    "entry,message",
    [
        ("yes", r"config.json's 'coupled_qk_retrofit' = 'yes' must map retrofit's options"),
        ({"integrator": "euler", "steps": 2}, r"config.json's .* must map retrofit's options .*; unknown \['steps'\]"),
        ({"integrator": "rk4"}, r"config.json's 'coupled_qk_retrofit': integrator='rk4' is not supported"),
    ],
)
def test_load_retrofitted_names_the_folder_of_a_malformed_entry(tmp_path, entry, message):
    # an edited config.json gave "TypeError: 'str' object is not a mapping" or an error without the folder
    import json

    retrofit(_model("llama")).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["coupled_qk_retrofit"] = entry
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"^{tmp_path}: {message}"):
        load_retrofitted(tmp_path)


def test_retrofit_refuses_a_plain_load_of_a_retrofitted_folder(tmp_path):
    # AutoModelForCausalLM.from_pretrained keeps only the base weights; retrofitting that model silently started
    # the coupling again from dt = 0, discarding the trained one
    model = retrofit(_model("llama"))
    _set_dt(model)
    model.save_pretrained(tmp_path)
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="loaded from a retrofitted folder .* use load_retrofitted"):
        retrofit(plain)
    from coupled_qk.hf import restore_retrofit

    restore_retrofit(plain, tmp_path).eval()
    x = torch.randint(0, V, (1, 9))
    with torch.no_grad():
        assert torch.equal(plain(x).logits, model.eval()(x).logits)

"""Native transformers models: Auto round trip, strict loading, initialisation, cached and padded generation."""

import dataclasses
import json
import math

import pytest
import torch

pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, DynamicCache  # noqa: E402

from coupled_qk import GPT, GPTConfig, MapOptions, QKMap, ScoringRule, option, scaled_dot_product  # noqa: E402
from coupled_qk.hf import CoupledQKConfig, CoupledQKForCausalLM  # noqa: E402
from coupled_qk.models import registry  # noqa: E402
from coupled_qk.models.registry import VARIANTS, variant_names  # noqa: E402

V = 53
# every named variant (every attention is one too): built-in, drop-in or plugin
CASES = {n: VARIANTS[n] for n in variant_names()}


def tiny_gpt(variant="coupled", seed=0, **kw) -> GPT:
    torch.manual_seed(seed)
    fields = dict(vocab_size=V, block_size=40, n_layer=2, d_model=32, n_heads=4, n_kv_heads=2)
    return GPT(GPTConfig(**{**fields, **CASES[variant], **kw})).eval()


def save(model: GPT, path, **config_kwargs):
    CoupledQKForCausalLM.from_gpt(model, **config_kwargs).save_pretrained(path)
    return path


@pytest.mark.parametrize("variant", list(CASES))
def test_auto_round_trip_identical_logits(tmp_path, variant):
    gpt = tiny_gpt(variant)
    save(gpt, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "coupled_qk" and "gpt" not in cfg  # flat
    assert cfg["attention"] == CASES[variant]["attention"]
    assert AutoConfig.from_pretrained(tmp_path).to_gpt_config() == gpt.config
    lm = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    base = AutoModel.from_pretrained(tmp_path).eval()
    assert type(lm).__name__ == "CoupledQKForCausalLM" and type(base).__name__ == "CoupledQKModel"
    idx = torch.randint(0, V, (2, 11))
    with torch.no_grad():
        ref = gpt(idx)
        out = lm(input_ids=idx, labels=idx)
        assert torch.equal(out.logits, ref)
        assert torch.equal(gpt.lm_head(base(input_ids=idx).last_hidden_state), ref)
    manual = torch.nn.functional.cross_entropy(ref[:, :-1].reshape(-1, V), idx[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, manual)
    assert lm.model.lm_head.weight.data_ptr() == lm.model.tok_emb.weight.data_ptr()


@pytest.mark.parametrize("variant", list(CASES))
def test_cached_generate_equals_gpt_generate(variant):
    gpt = tiny_gpt(variant)
    lm = CoupledQKForCausalLM.from_gpt(gpt)
    idx = torch.randint(0, V, (2, 5))
    ref = gpt.generate(idx, 12, temperature=0)
    cached = lm.generate(idx, max_new_tokens=12, do_sample=False)
    uncached = lm.generate(idx, max_new_tokens=12, do_sample=False, use_cache=False)
    assert torch.equal(cached, ref) and torch.equal(uncached, ref)
    assert torch.equal(ref, gpt.generate(idx, 12, temperature=0, use_cache=False))


def test_beam_search_and_sampling_cached_equal_uncached():
    lm = CoupledQKForCausalLM.from_gpt(tiny_gpt("coupled_leapfrog"))
    idx = torch.randint(0, V, (2, 5))
    beams = [lm.generate(idx, max_new_tokens=6, num_beams=3, do_sample=False, use_cache=c) for c in (True, False)]
    assert torch.equal(*beams)  # the DynamicCache is reordered with the beams
    samples = []
    for c in (True, False):
        torch.manual_seed(1)
        samples.append(lm.generate(idx, max_new_tokens=6, do_sample=True, top_k=5, use_cache=c))
    assert torch.equal(*samples)


def test_cache_holds_the_prefix_and_matches_full_forward():
    lm = CoupledQKForCausalLM.from_gpt(tiny_gpt("coupled_differential"))
    idx = torch.randint(0, V, (1, 9))
    cache = DynamicCache(config=lm.config)
    with torch.no_grad():
        first = lm(idx[:, :6], cache=cache).logits
        assert cache.get_seq_length() == 6
        rest = lm(idx[:, 6:], cache=cache).logits
        full = lm(idx, use_cache=False).logits
    torch.testing.assert_close(torch.cat([first, rest], 1), full, atol=2e-5, rtol=1e-4)


def test_single_token_steps_fold_the_map_once_per_cache():
    """Decoding folds the coupled map into the projection (layers/folded.py); the folds live on the transformers
    cache, so the views made per step share them, and the steps still equal the full forward."""
    lm = CoupledQKForCausalLM.from_gpt(tiny_gpt("coupled_leapfrog"))
    idx = torch.randint(0, V, (2, 9))
    cache = DynamicCache(config=lm.config)
    with torch.no_grad():
        parts = [lm(idx[:, :6], cache=cache).logits]
        assert not getattr(cache, "_coupled_qk_folds", None)  # the prefill does not fold
        parts.append(lm(idx[:, 6:7], cache=cache).logits)
        folds = dict(cache._coupled_qk_folds)
        parts += [lm(idx[:, t : t + 1], cache=cache).logits for t in (7, 8)]
        full = lm(idx, use_cache=False).logits
    assert len(folds) == 2 and all(cache._coupled_qk_folds[i] is f for i, f in folds.items())
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("variant", list(CASES))
def test_left_padded_batch_generates_each_prompt_alone(variant):
    gpt = tiny_gpt(variant)
    lm = CoupledQKForCausalLM.from_gpt(gpt, pad_token_id=0)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, V, (n,), generator=g) for n in (4, 10, 7)]
    width = max(len(p) for p in prompts)
    ids = torch.zeros(3, width, dtype=torch.long)
    mask = torch.zeros(3, width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :], mask[i, width - len(p) :] = p, 1
    out = lm.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
    for i, p in enumerate(prompts):
        assert torch.equal(out[i, width:], gpt.generate(p[None], 8, temperature=0)[0, len(p) :])


def test_missing_config_json_is_a_clear_error(tmp_path):
    save(tiny_gpt(), tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        CoupledQKForCausalLM.from_pretrained(tmp_path)
    with pytest.raises((OSError, ValueError), match="config.json"):  # transformers' own message
        AutoModelForCausalLM.from_pretrained(tmp_path)


def _rewrite_weights(path, edit):
    from safetensors.torch import load_file, save_file

    weights = load_file(str(path / "model.safetensors"))
    edit(weights)
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})


def test_missing_unexpected_and_mismatched_weights_are_refused(tmp_path):
    save(tiny_gpt(), tmp_path)
    _rewrite_weights(tmp_path, lambda w: w.pop("model.blocks.1.attn.qkv.weight"))
    with pytest.raises(ValueError, match=r"missing weights \['model.blocks.1.attn.qkv.weight'\]"):
        AutoModelForCausalLM.from_pretrained(tmp_path)
    save(tiny_gpt(), tmp_path)
    _rewrite_weights(tmp_path, lambda w: w.update({"model.extra.weight": torch.zeros(3)}))
    with pytest.raises(ValueError, match=r"unexpected weights \['model.extra.weight'\]"):
        AutoModelForCausalLM.from_pretrained(tmp_path)
    save(tiny_gpt(), tmp_path)
    _rewrite_weights(tmp_path, lambda w: w.update({"model.ln_f.weight": torch.ones(7)}))
    with pytest.raises(ValueError, match=r"model.ln_f.weight \(stored \(7,\), model \(32,\)\)"):
        AutoModelForCausalLM.from_pretrained(tmp_path)


def test_config_edits_take_effect_and_bad_values_are_named(tmp_path):
    save(tiny_gpt("standard"), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["attention"], cfg["dt_init"] = "coupled", 0.0  # a standard checkpoint, retrofitted with coupling at dt=0
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="missing weights"):
        AutoModelForCausalLM.from_pretrained(tmp_path)
    lm = AutoModelForCausalLM.from_pretrained(tmp_path, strict=False).eval()
    assert lm.config.attention == "coupled" and lm.model.config.attention == "coupled"
    idx = torch.randint(0, V, (1, 8))
    with torch.no_grad():  # dt = 0: the coupled model computes exactly what the standard one did
        assert torch.equal(lm(idx).logits, tiny_gpt("standard")(idx))
    cfg["n_heads"] = 5
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="n_heads"):
        AutoConfig.from_pretrained(tmp_path)


def test_legacy_nested_config_loads_with_top_level_precedence():
    c = CoupledQKConfig(gpt={"n_layer": 5, "d_model": 64, "attention": "coupled"}, n_layer=2, use_cache=False)
    assert (c.n_layer, c.d_model, c.attention, c.use_cache) == (2, 64, "coupled", True)
    assert c.to_gpt_config().n_layer == 2 and c.num_hidden_layers == 2 and c.head_dim == 16


def test_fresh_model_initialises_exactly_like_gpt():
    config = CoupledQKConfig.from_gpt_config(tiny_gpt("coupled_differential").config)
    torch.manual_seed(7)
    hf = CoupledQKForCausalLM(config)
    torch.manual_seed(7)
    ref = GPT(config.to_gpt_config())
    for (name, a), b in zip(hf.model.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(a, b), name


class _Turn(QKMap):
    """A plugin map holding parameters itself: an angle, a step ``dt`` without a ``dt_init`` option, a biased layer."""

    def __init__(self, d_head: int, n_heads: int, angle_init: float = 0.3, step0: float = 0.25):
        super().__init__()
        self.angle = torch.nn.Parameter(torch.full((n_heads, 1, 1), angle_init))
        self.dt = torch.nn.Parameter(torch.full((n_heads,), step0))
        self.mix = torch.nn.Linear(d_head, d_head)

    def forward(self, q, k):
        return q + self.angle * self.dt.view(-1, 1, 1) * self.mix(k), k


@dataclasses.dataclass
class _TurnOptions(MapOptions):
    angle_init: float = option(0.3)
    step0: float = option(0.25)


class _Scaled(ScoringRule):
    """A plugin scoring rule with a parameter of its own and no ``reset_parameters``."""

    def __init__(self, d_head: int, n_heads: int, layer_idx: int):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.full((n_heads, 1, 1), 1.5 + layer_idx))

    def forward(self, q, k, v, eager, dropout_p=0.0, mask=None):
        return scaled_dot_product(q * self.scale, k, v, eager, dropout_p, mask)


@pytest.mark.parametrize("attention", ["invertible", "turn_scaled"])
def test_missing_map_and_rule_weights_initialised_like_gpt_with_strict_false(tmp_path, attention):
    # the parameters a map or a rule holds itself (not only ``dt``) were left as torch.empty garbage, and a map's
    # dt without a ``dt_init`` option was a KeyError
    with registry.isolated():
        registry.register_qk_map("turn", "turn", _Turn, _TurnOptions)
        registry.register_scoring("scaled", _Scaled)
        config = GPTConfig(attention=attention, vocab_size=V, block_size=40, n_layer=2, d_model=32, n_heads=4)
        save(GPT(config), tmp_path)
        _rewrite_weights(tmp_path, lambda w: [w.pop(k) for k in list(w) if ".qk_map." in k or ".scorer." in k])
        lm = AutoModelForCausalLM.from_pretrained(tmp_path, strict=False)
        for i, block in enumerate(lm.model.blocks):
            m = block.attn.qk_map
            if attention == "invertible":  # the coupling networks: first layer uniform, last layer zero
                for net in [*m.q_nets, *m.k_nets]:
                    assert 0 < net.w_in.abs().max() <= 1 / math.sqrt(8) and 0 < net.b_in.abs().max() <= 1 / math.sqrt(8)
                    assert not net.w_out.any() and not net.b_out.any()
                continue
            assert torch.equal(m.angle, torch.full((4, 1, 1), 0.3)) and torch.equal(m.dt, torch.full((4,), 0.25))
            assert 0 < m.mix.bias.abs().max() <= 1 / math.sqrt(8)  # as nn.Linear's bias
            assert torch.equal(block.attn.scorer.scale, torch.full((4, 1, 1), 1.5 + i))


def test_missing_weights_initialised_like_gpt_with_strict_false(tmp_path):
    # every weight of layer 1 is missing; strict=False draws them with GPT's init (checked against its formulas)
    gpt = tiny_gpt("coupled_differential", n_layer=2, d_model=64, n_heads=8, n_kv_heads=8, dt_init=0.25)
    save(gpt, tmp_path)
    _rewrite_weights(tmp_path, lambda w: [w.pop(k) for k in list(w) if k.startswith("model.blocks.1.")])
    lm = AutoModelForCausalLM.from_pretrained(tmp_path, strict=False)
    b1 = lm.model.blocks[1]
    assert torch.equal(b1.attn.qk_map.dt, torch.full((8,), 0.25))
    assert torch.equal(b1.ln_1.weight, torch.ones(64)) and torch.equal(b1.ln_1.bias, torch.zeros(64))
    assert torch.equal(b1.attn.scorer.subln.weight, torch.ones(16))
    assert b1.attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert b1.mlp.fc.weight.std().item() == pytest.approx(0.02, rel=0.05)
    for w in (b1.attn.out_proj.weight, b1.mlp.out_proj.weight):
        assert w.std().item() == pytest.approx(0.02 / math.sqrt(4), rel=0.05)
    f = b1.attn.qk_map.force  # uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)): std = bound / sqrt(3)
    assert f.w_in.abs().max().item() <= 1 / math.sqrt(8) and f.w_in.std().item() == pytest.approx(
        1 / math.sqrt(8) / math.sqrt(3), rel=0.15
    )
    rule = b1.attn.scorer
    lam = torch.cat([rule.lambda_q1, rule.lambda_k1, rule.lambda_q2, rule.lambda_k2])
    assert lam.std().item() == pytest.approx(0.1, rel=0.3)
    for name, p in gpt.blocks[0].named_parameters():  # layer 0 was loaded, not re-drawn
        assert torch.equal(p, lm.model.blocks[0].get_parameter(name)), name

"""GPT model and config: presets against parameter arithmetic, validation, errors."""

import json

import pytest
import torch

from coupled_qk import GPT, GPTConfig, coupling_parameter_overhead


def standard_param_count(V, T, L, d, H, d_head, d_ff, learned_pos=False):
    attn = d * (3 * H * d_head) + H * d_head * d
    mlp = 2 * d * d_ff
    norms = 2 * 2 * d
    return V * d + (T * d if learned_pos else 0) + L * (attn + mlp + norms) + 2 * d


@pytest.mark.parametrize(
    "preset, shape",
    [
        ("tiny", (8192, 128, 4, 128, 4)),
        ("60m", (50257, 512, 12, 512, 8)),
        ("150m", (50257, 512, 16, 768, 12)),
        ("350m", (50257, 512, 24, 1024, 16)),
    ],
)
def test_preset_parameter_counts_match_arithmetic(preset, shape):
    V, T, L, d, H = shape
    info = coupling_parameter_overhead(GPTConfig.from_preset(preset, attention="coupled"))
    d_head = d // H
    assert info["standard_params"] == standard_param_count(V, T, L, d, H, d_head, 4 * d)
    assert info["extra"] == L * (2 * d_head * d_head + H)  # one shared f (d_head -> d_head -> d_head) + dt per head
    assert info["overhead_percent"] == pytest.approx(100 * info["extra"] / info["standard_params"])


def test_60m_coupling_overhead_figure():
    info = coupling_parameter_overhead(GPTConfig.from_preset("60m", attention="coupled"))
    assert info["extra"] == 98_400
    assert info["overhead_percent"] == pytest.approx(0.155, abs=5e-4)


def test_uncoupled_mlp_has_matched_capacity():
    a = coupling_parameter_overhead(GPTConfig.from_preset("tiny", attention="coupled"))
    b = coupling_parameter_overhead(GPTConfig.from_preset("tiny", attention="uncoupled_mlp"))
    assert a["extra"] == b["extra"] > 0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(attention="linear"), "attention"),
        (dict(n_heads=4, n_kv_heads=3), "n_kv_heads"),
        (dict(attention="differential", n_heads=3, d_model=96), "even"),
        (dict(position="alibi"), "position"),
        (dict(position="learned", map_position="post_rope"), "post_rope"),
        (dict(vocab_size=0), "vocab_size"),
        (dict(attention="coupled", dt_init=float("inf")), "dt_init"),
        (dict(attention="coupled", integrator="rk4"), "integrator"),
        (dict(attention="coupled", n_steps=-2), "n_steps"),
        (dict(attention="uncoupled_mlp", dynamics_hidden=0), "hidden"),
        (dict(dropout=1.5), "dropout"),
        (dict(dropout=float("nan")), "dropout"),
        (dict(rope_base=0.0), "rope_base"),
        (dict(rope_base=float("inf")), "rope_base"),
        (dict(n_layer="two"), "n_layer"),
        (dict(use_mlp="maybe"), "use_mlp"),
    ],
)
def test_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GPTConfig(**kwargs)


def test_config_rejects_unknown_fields_and_round_trips(tmp_path):
    with pytest.raises(ValueError, match="n_head"):
        GPTConfig.from_dict({"n_head": 4})
    with pytest.raises(ValueError, match="unknown preset"):
        GPTConfig.from_preset("1b")
    cfg = GPTConfig.from_preset("tiny", attention="coupled", integrator="leapfrog")
    cfg.save(tmp_path / "c.json")
    assert GPTConfig.load(tmp_path / "c.json") == cfg


def test_old_config_with_dynamics_position_loads_as_map_position(tmp_path):
    """Configs saved before the rename (checkpoint model_config.json, run config.json model overrides) load,
    with a DeprecationWarning naming both names; an old and a new name that disagree are an error."""
    from coupled_qk.training.config import TrainConfig

    old = {**GPTConfig(attention="coupled").to_dict(), "dynamics_position": "post_rope"}
    del old["map_position"]
    (tmp_path / "model_config.json").write_text(json.dumps(old))
    with pytest.warns(DeprecationWarning, match="'dynamics_position' is now called 'map_position'"):
        cfg = GPTConfig.load(tmp_path / "model_config.json")
    assert cfg.map_position == "post_rope" and "dynamics_position" not in cfg.to_dict()
    with pytest.warns(DeprecationWarning):
        # (with a query-key map: map_position is refused where nothing reads it, tests/models/test_field_rules.py)
        assert (
            GPTConfig.from_dict({"attention": "coupled", "dynamics_position": "post_rope"}).map_position == "post_rope"
        )
    with pytest.warns(DeprecationWarning):
        run = TrainConfig(max_steps=1, model={"attention": "coupled", "dynamics_position": "post_rope"})
    assert run.model == {"attention": "coupled", "map_position": "post_rope"}
    assert run.gpt_config().map_position == "post_rope"
    with pytest.raises(ValueError, match="disagree"):
        GPTConfig.from_dict({"dynamics_position": "post_rope", "map_position": "pre_rope"})


def test_forward_errors():
    model = GPT(GPTConfig(vocab_size=50, block_size=8, n_layer=1, d_model=16, n_heads=2))
    with pytest.raises(ValueError, match="block_size=8"):
        model(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="token ids"):
        model(torch.full((1, 4), 50))
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="block_size"):
        model.generate(torch.zeros(1, 5, dtype=torch.long), 4, context="error")
    cache = model.new_cache()
    model(torch.zeros(1, 6, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="cached 6"):
        model(torch.zeros(1, 3, dtype=torch.long), cache)


def test_tied_embeddings_and_logits_shape():
    model = GPT(GPTConfig(vocab_size=50, block_size=8, n_layer=1, d_model=16, n_heads=2))
    assert model.lm_head.weight is model.tok_emb.weight
    assert model(torch.zeros(3, 8, dtype=torch.long)).shape == (3, 8, 50)


@pytest.mark.slow
def test_training_reduces_loss_for_every_variant():
    from coupled_qk import ATTENTION_VARIANTS

    for attention in ATTENTION_VARIANTS:
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=16, block_size=16, n_layer=1, d_model=32, n_heads=2, attention=attention))
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        x = torch.arange(16).repeat(4, 1) % 16
        idx, tgt = x[:, :-1], x[:, 1:]
        first = model.loss(idx, tgt).item()
        for _ in range(80):
            opt.zero_grad()
            model.loss(idx, tgt).backward()
            opt.step()
        assert model.loss(idx, tgt).item() < 0.2 * first, attention


def test_width_must_split_into_heads_and_types_are_checked():
    with pytest.raises(ValueError, match="d_model=128 is not divisible by n_heads=3"):
        GPTConfig(d_model=128, n_heads=3)
    assert GPTConfig(d_model=128, n_heads=3, d_head=42).d_head == 42  # explicit d_head is allowed
    with pytest.raises(ValueError, match="d_model='abc'"):
        GPTConfig(d_model="abc")


def test_generate_rejects_bad_top_k():
    model = GPT(GPTConfig(vocab_size=50, block_size=8, n_layer=1, d_model=16, n_heads=2))
    with pytest.raises(ValueError, match="top_k=0"):
        model.generate(torch.zeros(1, 2, dtype=torch.long), 2, top_k=0)


def test_invalid_config_json_names_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json is not valid JSON"):
        GPTConfig.load(bad)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("n_layer", "four", r"n_layer='four' is not an integer"),
        ("flash", True, r"unknown GPTConfig field\(s\) 'flash'; valid fields"),
        ("d_model", -8, r"d_model=-8"),
    ],
)
def test_a_refused_field_of_a_config_file_names_the_file(tmp_path, field, value, message):
    """A run's ``model_config.json`` (or ``--config`` file) with a field the config refuses said
    "GPTConfig.n_layer='four' is not an integer" from load_run/eval/export, naming no file."""
    import json

    from coupled_qk.training.config import TrainConfig

    path = tmp_path / "model_config.json"
    path.write_text(
        json.dumps({**GPTConfig(vocab_size=50, block_size=8, n_layer=1, d_model=16, n_heads=2).to_dict(), field: value})
    )
    with pytest.raises(ValueError, match=f"^config file {path}: .*{message}"):
        GPTConfig.load(path)
    path.write_text(json.dumps({"lr": "fast"}))
    with pytest.raises(ValueError, match=f"^config file {path}: .*lr='fast' is not a number"):
        TrainConfig.load(path)

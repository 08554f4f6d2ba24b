"""CoupledQKConfig: the standard transformers names map onto the GPTConfig fields in both directions, conflicts are
errors, and every value is validated exactly as GPTConfig validates it (GPTConfig is the oracle)."""

import json

import pytest

pytest.importorskip("transformers")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from coupled_qk import GPTConfig  # noqa: E402
from coupled_qk.hf import CoupledQKConfig, CoupledQKForCausalLM  # noqa: E402
from coupled_qk.hf.configuration import STANDARD_NAMES  # noqa: E402

BASE = dict(vocab_size=50, block_size=32, attention="coupled")


def test_the_issue_example_builds_what_it_says():
    c = CoupledQKConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, vocab_size=50)
    assert (c.n_layer, c.d_model, c.n_heads) == (2, 64, 2)
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.head_dim, c.intermediate_size) == (
        2,
        64,
        2,
        32,
        256,
    )
    model = CoupledQKForCausalLM(c)
    assert len(model.model.blocks) == 2 and model.model.tok_emb.weight.shape == (50, 64)
    assert model.model.blocks[0].attn.n_heads == 2


def test_assigning_a_standard_name_sets_our_field_and_json_keeps_our_names(tmp_path):
    c = CoupledQKConfig(**BASE)
    c.num_hidden_layers = 3
    assert c.n_layer == 3 and c.to_gpt_config().n_layer == 3
    c.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["n_layer"] == 3 and not set(STANDARD_NAMES) & set(saved)
    assert CoupledQKConfig.from_pretrained(tmp_path).num_hidden_layers == 3


def test_conflicting_names_are_an_error_and_agreeing_ones_are_not():
    with pytest.raises(ValueError, match=r"num_hidden_layers=2 and n_layer=4, which name the same field"):
        CoupledQKConfig(num_hidden_layers=2, n_layer=4)
    assert CoupledQKConfig(num_hidden_layers=2, n_layer=2).n_layer == 2
    assert CoupledQKConfig(num_key_value_heads=None, head_dim=None, n_heads=4).n_kv_heads == 4  # None: default


def test_out_of_range_values_are_refused_naming_the_standard_name():
    with pytest.raises(ValueError, match=r"num_hidden_layers \(GPTConfig.n_layer\): GPTConfig.n_layer=-1 must be"):
        CoupledQKConfig(num_hidden_layers=-1)
    with pytest.raises(ValueError, match=r"num_key_value_heads \(GPTConfig.n_kv_heads\).* must divide n_heads=4"):
        CoupledQKConfig(num_attention_heads=4, num_key_value_heads=3)
    with pytest.raises(ValueError, match=r"GPTConfig.n_layer=0 must be a positive integer"):
        CoupledQKConfig(n_layer=0)


VALUES = st.one_of(st.integers(-3, 300), st.sampled_from([None, 1.5, "8", True]))


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(STANDARD_NAMES)), VALUES, max_size=4))
def test_standard_names_behave_exactly_like_our_names(given_values):
    """Any mix of standard names and values: CoupledQKConfig builds the config GPTConfig builds from our names,
    or fails where GPTConfig fails (a ValueError), and reading the standard names gives our fields back."""
    ours = {STANDARD_NAMES[k]: v for k, v in given_values.items() if v is not None}
    try:
        expected = GPTConfig(**BASE, **ours)
    except (ValueError, TypeError):
        with pytest.raises(ValueError):
            CoupledQKConfig(**BASE, **given_values)
        return
    c = CoupledQKConfig(**BASE, **given_values)
    assert c.to_gpt_config() == expected
    for standard, field in STANDARD_NAMES.items():
        assert getattr(c, standard) == getattr(expected, field)


ASSIGNABLE = sorted(
    {
        *STANDARD_NAMES,
        "n_layer",
        "d_model",
        "n_heads",
        "n_kv_heads",
        "attention",
        "position",
        "use_mlp",
        "dropout",
        "dt_init",
        "n_steps",
        "integrator",
        "rope_base",
    }
)
ASSIGNED = st.one_of(
    st.integers(-3, 300),
    st.floats(-2, 5),
    st.sampled_from([1.5, "8", True, False, "euler", "leapfrog", "standard", "coupled", "bogus", "rope", "learned"]),
)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(ASSIGNABLE), ASSIGNED)
def test_assignment_is_checked_exactly_as_construction(key, value):
    """Assigning a field (our name, its standard name or a flat map option) after construction succeeds exactly
    where building the config with that value succeeds, and then gives the same config; a refused assignment
    leaves the config as it was (it used to be stored unchecked and fail only when the saved folder loaded)."""
    from coupled_qk.models.config import DERIVED
    from coupled_qk.models.registry import flat_option_names

    c = CoupledQKConfig(**BASE)
    before = c.to_gpt_config()
    fields = before.to_dict()
    ours = STANDARD_NAMES.get(key, key)
    for field, derive in DERIVED.items():  # a derived size follows the assignment (GPTConfig.follow)
        if field != ours and fields[field] == derive(fields):
            fields[field] = None
    nested = flat_option_names().get(ours)
    if nested is not None and nested in (fields["qk_map"] or {}):  # an assigned map option changes qk_map's value
        fields["qk_map"] = {**fields["qk_map"], nested: value}  # (given beside it, it would be a second value)
    else:
        fields[ours] = value
    if ours == "attention" and value != before.attention:
        fields["qk_map"] = None  # the map options follow the attention (BASE's are its map's defaults)
    try:
        expected = CoupledQKConfig(**fields).to_gpt_config()
    except ValueError:
        with pytest.raises(ValueError):
            setattr(c, key, value)
        assert c.to_gpt_config() == before
        return
    setattr(c, key, value)
    assert c.to_gpt_config() == expected


def test_untied_embeddings_and_near_miss_names_are_refused(tmp_path):
    with pytest.raises(ValueError, match="tie_word_embeddings=False: coupled-qk models always tie"):
        CoupledQKConfig(**BASE, tie_word_embeddings=False)
    c = CoupledQKConfig(**BASE)
    with pytest.raises(ValueError, match="tie_word_embeddings=False"):
        c.tie_word_embeddings = False
    CoupledQKForCausalLM(c).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="tie_word_embeddings=False"):  # the head would load at random
        CoupledQKForCausalLM.from_pretrained(tmp_path, tie_word_embeddings=False)
    for typo, field in (("n_layers", "n_layer"), ("attn", None), ("d_modle", "d_model"), ("n_step", "n_steps")):
        if field is None:  # not close to any field: refused, it would change nothing (a saved one warns: below)
            with pytest.raises(ValueError, match="attn=3, which no coupled-qk model reads"):
                CoupledQKConfig(**BASE, **{typo: 3})
            continue
        with pytest.raises(ValueError, match=f"unknown field '{typo}'; did you mean '{field}'"):
            CoupledQKConfig(**BASE, **{typo: 3})
    assert CoupledQKConfig(**BASE, num_labels=3, torch_dtype="float32").num_labels == 3  # transformers' own keys


def test_an_old_config_json_with_dynamics_position_loads(tmp_path):
    """A config.json saved before GPTConfig.dynamics_position became map_position keeps its setting."""
    data = CoupledQKConfig(attention="coupled", map_position="post_rope").to_dict()
    data["dynamics_position"] = data.pop("map_position")
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.warns(DeprecationWarning, match="map_position"):
        config = CoupledQKConfig.from_pretrained(tmp_path)
    assert config.map_position == "post_rope" and not hasattr(config, "dynamics_position")
    assert config.to_gpt_config().map_position == "post_rope"

"""retrofit() with any registered query-key map (the ``start_at_identity()`` contract, verified numerically), its
``layers`` option, and every option saved with the model (coupled_qk.hf.retrofit, hf/retrofit_maps.py)."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch
import torch.nn as nn

transformers = pytest.importorskip("transformers")

from coupled_qk import MapOptions, QKMap, option  # noqa: E402
from coupled_qk.hf import load_retrofitted, retrofit  # noqa: E402
from coupled_qk.hf.retrofit import coupling_parameters, step_sizes  # noqa: E402
from coupled_qk.models import registry  # noqa: E402

V = 61


def _llama(layers=3, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=None,
        eos_token_id=None,
    )
    return transformers.LlamaForCausalLM(cfg).eval()


def _gpt2(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(
        vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=None, eos_token_id=None
    )
    return transformers.GPT2LMHeadModel(cfg).eval()


def _logits(model, seed=2):
    x = torch.randint(0, V, (2, 11), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(x).logits


def _perturb(model):
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in coupling_parameters(model):
            p.add_(0.3 * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("make", [_llama, _gpt2])
def test_plugin_map_with_start_at_identity_retrofits_at_the_pretrained_function(drift, make, tmp_path):
    model = make()
    ref = _logits(model)
    rf = retrofit(copy.deepcopy(model), qk_map="drift", map_options={"gain": 2.0, "dt_init": 0.5}, gqa="shared")
    assert torch.equal(_logits(rf), ref)  # dt_init=0.5 asked, start_at_identity() made dt = 0
    n_layers = rf.config.num_hidden_layers
    assert len(step_sizes(rf)) == n_layers and all(torch.equal(dt, torch.zeros_like(dt)) for dt in step_sizes(rf))
    _perturb(rf)
    moved = _logits(rf)
    assert not torch.allclose(moved, ref)
    saved = rf.config.coupled_qk_retrofit
    assert saved["qk_map"] == "drift" and saved["map_options"] == {"gain": 2.0, "dt_init": 0.5}
    rf.save_pretrained(tmp_path)
    loaded = load_retrofitted(tmp_path).eval()
    assert torch.equal(_logits(loaded), moved)
    assert [type(m.qk_dynamics).__name__ for m in loaded.modules() if hasattr(m, "qk_dynamics")] == ["Drift"] * n_layers


@pytest.mark.parametrize("qk_map,options", [("query_mlp", {"dt_init": 0.7}), ("invertible", {"n_alternations": 2})])
def test_builtin_maps_retrofit_at_the_pretrained_function(qk_map, options):
    model = _llama()
    ref = _logits(model)
    rf = retrofit(copy.deepcopy(model), qk_map=qk_map, map_options=options)
    assert torch.equal(_logits(rf), ref)
    _perturb(rf)
    assert not torch.allclose(_logits(rf), ref)


class NoIdentity(QKMap):
    keys_per_query_head = True

    def __init__(self, d_head: int, n_heads: int, dt_init: float = 0.1):
        super().__init__()
        self.dt = nn.Parameter(torch.full((n_heads,), float(dt_init)))

    def forward(self, q, k):
        return q + self.dt.to(q.dtype).view(1, -1, 1, 1) * k, k


class WrongIdentity(NoIdentity):
    def start_at_identity(self) -> None:
        nn.init.constant_(self.dt, 1e-3)  # not the identity


class TakesArgument(NoIdentity):
    def start_at_identity(self, scale) -> None:
        nn.init.zeros_(self.dt)


@dataclasses.dataclass
class DtOptions(MapOptions):
    dt_init: float = option(0.1)


def test_map_without_start_at_identity_is_refused_naming_what_to_add():
    with registry.isolated():
        registry.register_qk_map("no_identity", "no_identity", NoIdentity, DtOptions)
        model = _llama()
        with pytest.raises(
            ValueError,
            match=r"qk_map='no_identity'.*NoIdentity has no start_at_identity\(\) method"
            r".*add to the class a method 'def start_at_identity\(self\) -> None'",
        ):
            retrofit(model, qk_map="no_identity")
        assert not any(hasattr(m, "qk_dynamics") for m in model.modules())  # refused before any change


def test_map_that_start_at_identity_does_not_make_the_identity_is_refused():
    with registry.isolated():
        registry.register_qk_map("wrong_identity", "wrong_identity", WrongIdentity, DtOptions)
        with pytest.raises(
            ValueError,
            match=r"qk_map='wrong_identity'.*WrongIdentity.start_at_identity\(\) does not "
            r"make the map the identity: on float64 q, k of shape \(1, 4, 1, 8\)",
        ):
            retrofit(_llama(), qk_map="wrong_identity")


def test_registration_checks_the_start_at_identity_signature():
    with registry.isolated():
        with pytest.raises(ValueError, match=r"TakesArgument.start_at_identity\(self, scale\).* must take no argument"):
            registry.register_qk_map("takes_arg", "takes_arg", TakesArgument, DtOptions)
        not_method = type("NotMethod", (NoIdentity,), {"start_at_identity": 3})
        with pytest.raises(ValueError, match=r"NotMethod.start_at_identity = 3 must be a method"):
            registry.register_qk_map("not_method", "not_method", not_method, DtOptions)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(qk_map="nope"), r"qk_map='nope' is unknown; expected one of \['dynamics'"),
        (
            dict(qk_map="query_mlp", integrator="leapfrog"),
            r"\{'integrator': 'leapfrog'\} are options of "
            r"qk_map='dynamics' only; give query_mlp's options as map_options",
        ),
        (dict(map_options={"hidden": 4}), r"map_options=\{'hidden': 4\} is for maps other than qk_map='dynamics'"),
        (dict(qk_map="query_mlp", map_options={"steps": 2}), r"unknown option\(s\) \['steps'\] of qk_map='query_mlp'"),
        (dict(qk_map="query_mlp", map_options={"hidden": 0}), r"map_options=\{'hidden': 0\} of qk_map='query_mlp': "),
        (dict(qk_map="query_mlp", map_options=[1]), r"map_options=\[1\] must be a dict"),
    ],
)
def test_map_options_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        retrofit(_llama(), **kwargs)


def test_every_option_is_saved_and_applied_on_load(tmp_path):
    # freeze_base was not recorded: a reloaded model trained its base weights again
    rf = retrofit(_llama(), freeze_base=True, integrator="leapfrog", layers=[2, 0])
    saved = dict(rf.config.coupled_qk_retrofit)
    assert saved == dict(
        integrator="leapfrog",
        n_steps=1,
        dt_init=0.0,
        hidden=None,
        force="mlp",
        shared_across_heads=True,
        gqa="expand",
        position="pre_rope",
        freeze_base=True,
        qk_map="dynamics",
        map_options=None,
        layers=[0, 2],
    )
    rf.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["coupled_qk_retrofit"] == saved
    loaded = load_retrofitted(tmp_path)
    trainable = {n for n, p in loaded.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in rf.named_parameters() if ".qk_dynamics." in n} and len(trainable) == 2 * 3
    assert loaded.config.coupled_qk_retrofit == saved


def test_layers_retrofits_only_the_chosen_layers_and_reloads_them(tmp_path):
    model = _llama()
    ref = _logits(model)
    rf = retrofit(copy.deepcopy(model), layers=[1])
    attn = [layer.self_attn for layer in rf.model.layers]
    assert [hasattr(a, "qk_dynamics") for a in attn] == [False, True, False]
    assert [a.forward.__func__ is type(a).forward for a in (attn[0], attn[2])] == [True, True]  # standard attention
    assert torch.equal(_logits(rf), ref)
    _perturb(rf)
    moved = _logits(rf)
    assert not torch.allclose(moved, ref)
    rf.save_pretrained(tmp_path)
    loaded = load_retrofitted(tmp_path).eval()
    assert [hasattr(layer.self_attn, "qk_dynamics") for layer in loaded.model.layers] == [False, True, False]
    assert torch.equal(_logits(loaded), moved)


@pytest.mark.parametrize(
    "layers,message",
    [
        ([], r"layers=\[\] selects no layer"),
        ([3], r"layers=\[3\]: \[3\] out of range; expected a list of distinct layer indices from 0 to 2"),
        ([-1], r"layers=\[-1\]: \[-1\] out of range"),
        ([0, 2, 0], r"layers=\[0, 2, 0\]: \[0\] given more than once"),
        ("1", r"layers='1' must be a list of distinct layer indices"),
        ([True], r"layers=\[True\]: every entry must be an integer"),
        ([1.0], r"layers=\[1.0\]: every entry must be an integer"),
    ],
)
def test_layers_errors(layers, message):
    with pytest.raises(ValueError, match=message):
        retrofit(_llama(), layers=layers)


def test_a_folder_saved_before_the_new_options_loads_with_their_defaults(tmp_path):
    rf = retrofit(_llama(), integrator="leapfrog")
    _perturb(rf)
    rf.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    for key in ("freeze_base", "qk_map", "map_options", "layers"):  # what older versions wrote: the first eight
        del config["coupled_qk_retrofit"][key]
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = load_retrofitted(tmp_path).eval()
    assert torch.equal(_logits(loaded), _logits(rf.eval()))
    assert all(p.requires_grad for p in loaded.parameters())

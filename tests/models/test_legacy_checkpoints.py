"""Folders written before Differential Attention became a scoring-rule module (its parameters were the attention
layer's own: ``attn.lambda_q1``, ``attn.subln.weight``) load with today's code and compute what they computed:
a checkpoint, its resume (optimizer state included) and a Hugging Face export (tests/models/legacy_differential,
written by that code; see its README). Values are compared up to float32 rounding: the fixture was computed on
another machine, whose kernels may sum in another order; a wrong parameter or moment is off by far more (a step
moves a weight by about ``lr = 1e-2``)."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from coupled_qk import GPT
from coupled_qk.models.config import GPTConfig
from coupled_qk.models.gpt import current_state_key
from coupled_qk.ops.losses import next_token_loss
from coupled_qk.training.config import TrainConfig
from coupled_qk.training.model_setup import build_optimizer, current_optimizer_state, load_optimizer_state
from coupled_qk.training.run_folder import RunFolder

LEGACY = Path(__file__).parent / "legacy_differential"
EXPECTED = load_file(str(LEGACY / "expected.safetensors"))
TRAIN = TrainConfig(max_steps=2, lr=1e-2)  # what make.py trained with
CLOSE = dict(rtol=1e-4, atol=1e-6)
"""float32 rounding of a few steps on another machine; a misplaced Adam moment moves a weight by ~1e-2."""


def _load():
    """The model of the run's resume point, its weights loaded (strict: every old key finds its place)."""
    run = RunFolder(LEGACY / "run")
    checkpoint = run.checkpoint(run.resume_checkpoint())
    model = GPT(checkpoint.model_config())
    checkpoint.load_weights(model)
    return model, checkpoint


def _step3(model: GPT, optimizer) -> None:
    x = EXPECTED["batch3"]
    next_token_loss(model(x[:, :-1]), x[:, 1:]).backward()
    optimizer.step()


def _assert_step3_weights(model: GPT) -> None:
    for key, value in model.state_dict().items():
        if key != "lm_head.weight":  # tied to the embedding
            old = key.replace("attn.scorer.", "attn.")
            torch.testing.assert_close(value, EXPECTED[f"step3.{old}"], **CLOSE, msg=lambda m, key=key: f"{key}: {m}")


def test_the_checkpoint_loads_and_its_resume_takes_the_same_step():
    """Weights under the old names load into ``scorer``; the optimizer state numbers the parameters in the order
    they always had (the layer lists the lambdas first and the norm last), so the resumed step equals the one
    the old code took."""
    model, checkpoint = _load()
    optimizer = build_optimizer(model, TRAIN)
    load_optimizer_state(model, optimizer, checkpoint.optimizer_state(), TRAIN, types.SimpleNamespace(world=1))
    _step3(model, optimizer)
    _assert_step3_weights(model)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(EXPECTED["idx"]), EXPECTED["logits_after_step3"], **CLOSE)


def _module_order(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters in plain submodule order (``nn.Module``'s, without the layer's ``inline_parameter_order``):
    the scorer's after the map's, duplicates (the tied head) once."""
    out = [p for p in module._parameters.values() if p is not None]
    for child in module._modules.values():
        out += _module_order(child) if child is not None else []
    return list({id(p): p for p in out}.values())


def test_in_plain_submodule_order_the_resume_would_be_wrong():
    """The check above can fail: with the scorer's parameters listed after the map's (plain submodule order),
    the old optimizer state gives the map's step size the lambdas' moments (same shapes, no error), and another
    step."""
    model, checkpoint = _load()
    params = _module_order(model)
    groups = [[p for p in params if p.dim() >= 2], [p for p in params if p.dim() < 2]]  # as build_optimizer
    optimizer = torch.optim.AdamW(
        [{"params": groups[0], "weight_decay": TRAIN.weight_decay}, {"params": groups[1], "weight_decay": 0.0}],
        lr=TRAIN.lr,
        betas=(TRAIN.beta1, TRAIN.beta2),
    )
    optimizer.load_state_dict(checkpoint.optimizer_state())
    _step3(model, optimizer)
    with pytest.raises(AssertionError, match="qk_map.dt"):
        _assert_step3_weights(model)


def test_the_layer_lists_differential_parameters_in_their_old_order():
    """The lambdas first, the norm last, the map's parameters between (the order of the layer that held them):
    ``named_modules`` lists every module once, the same ones as ``nn.Module``'s traversal."""
    model = GPT(
        GPTConfig(vocab_size=32, block_size=8, n_layer=1, d_model=16, n_heads=4, attention="coupled_differential")
    )
    names = [n.removeprefix("blocks.0.attn.") for n, _ in model.named_parameters() if n.startswith("blocks.0.attn.")]
    lambdas = [f"scorer.lambda_{n}" for n in ("q1", "k1", "q2", "k2")]
    maps = ["qk_map.dt", "qk_map.force.w_in", "qk_map.force.w_out"]
    assert names == [*lambdas, "qkv.weight", "out_proj.weight", *maps, "scorer.subln.weight"]
    assert [p for _, p in model.named_parameters()] == [p for p in model.parameters()]
    listed = [m for _, m in model.named_modules()]
    assert len(listed) == len({id(m) for m in listed}) and {id(m) for m in listed} == {
        id(m) for m in _all_modules(model)
    }
    standard = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=1, d_model=16, n_heads=4))
    assert list(standard.parameters()) == _module_order(standard)  # other layers: nn.Module's order


def _all_modules(module: torch.nn.Module) -> list[torch.nn.Module]:
    out = [module]
    for child in module._modules.values():
        out += _all_modules(child) if child is not None else []
    return out


def test_an_optimizer_state_keyed_by_name_is_renamed():
    """FSDP's full optimizer state names the parameters: the old names are renamed to today's."""
    assert current_state_key("blocks.3.attn.subln.weight") == "blocks.3.attn.scorer.subln.weight"
    assert current_state_key("blocks.0.attn.dynamics.force.w_in") == "blocks.0.attn.qk_map.force.w_in"
    assert current_state_key("blocks.0.attn.qkv.weight") == "blocks.0.attn.qkv.weight"  # today's: unchanged
    state = {"state": {"blocks.0.attn.lambda_q1": {"step": 1}, "blocks.0.attn.qkv.weight": {"step": 1}}}
    state["param_groups"] = [{"params": ["blocks.0.attn.qkv.weight", "blocks.0.attn.subln.weight"], "lr": 1.0}]
    out = current_optimizer_state(state)
    assert set(out["state"]) == {"blocks.0.attn.scorer.lambda_q1", "blocks.0.attn.qkv.weight"}
    assert out["param_groups"] == [
        {"params": ["blocks.0.attn.qkv.weight", "blocks.0.attn.scorer.subln.weight"], "lr": 1.0}
    ]


def test_the_hugging_face_export_loads_and_saves_todays_names(tmp_path):
    pytest.importorskip("transformers")
    from coupled_qk.hf import CoupledQKForCausalLM

    model = CoupledQKForCausalLM.from_pretrained(LEGACY / "hf")  # strict: no missing or unexpected weight
    with torch.no_grad():
        torch.testing.assert_close(model(EXPECTED["idx"]).logits, EXPECTED["logits_after_step3"], **CLOSE)
        logits = model(EXPECTED["idx"]).logits
    model.save_pretrained(tmp_path / "again")
    keys = set(load_file(str(tmp_path / "again" / "model.safetensors")))
    assert "model.blocks.0.attn.scorer.lambda_q1" in keys and not any(".attn.lambda" in k for k in keys)
    again = CoupledQKForCausalLM.from_pretrained(tmp_path / "again")
    with torch.no_grad():
        assert torch.equal(again(EXPECTED["idx"]).logits, logits)  # the same weights, bit for bit


def test_the_fixture_is_what_make_py_computes_with_todays_code():
    """make.py's training, repeated with today's code, gives the fixture's numbers under today's names (its
    provenance; make.py writes with the writers of the code it records)."""
    import runpy

    threads = torch.get_num_threads()
    try:
        with torch.random.fork_rng(devices=[]):  # train() seeds the global stream and uses one thread
            now, _ = runpy.run_path(str(LEGACY / "make.py"))["train"]()
    finally:
        torch.set_num_threads(threads)
    assert {k.replace("attn.scorer.", "attn.") for k in now} == set(EXPECTED)
    for key, value in now.items():
        torch.testing.assert_close(value, EXPECTED[key.replace("attn.scorer.", "attn.")], **CLOSE)

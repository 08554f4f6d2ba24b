"""``GPT.generate`` and ``QKDynamics``/attention constructors: every argument checked once, at the boundary,
with ``TypeError``/``ValueError`` naming it; generated values (hypothesis) for each argument."""

from __future__ import annotations

import math
from unittest import mock

import pytest
import reliability_profile  # noqa: F401  (the example budget)
import torch
from hypothesis import given
from hypothesis import strategies as st

from coupled_qk import GPT, GPTConfig
from coupled_qk.checks.tensors import GREEDY_BELOW, check_generate_args
from coupled_qk.layers.attention import CausalSelfAttention
from coupled_qk.models.maps.dynamics import QKDynamics

VOCAB, BLOCK = 64, 32


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(
        GPTConfig.from_preset(
            "tiny", attention="coupled", vocab_size=VOCAB, block_size=BLOCK, n_layer=1, d_model=32, n_heads=2
        )
    ).eval()


WRONG_KIND = [None, "1", b"1", [1], 1j, object()]
NON_FINITE = [math.nan, math.inf, -math.inf]

BAD_ARGS = {  # argument: values that must be refused (the error must name the argument)
    "max_new_tokens": [-1, 2.0, True, *WRONG_KIND[1:]],
    "temperature": [-0.1, True, *NON_FINITE, "0.8", None],
    "top_k": [0, -3, 2.5, True, "5"],
    "use_cache": ["False", 0, 1, None],
    "generator": ["seed", 3],
    "attention_mask": [
        [1, 1],
        torch.ones(1, 3),
        torch.ones(2, 4, dtype=torch.bool),
        torch.full((1, 4), 2),
        torch.zeros(1, 4, dtype=torch.bool),
        torch.tensor([[1, 1, 1, 0]]),  # right padding: the new tokens would follow the padding
        torch.tensor([[1, 0, 1, 1]]),  # a gap: padding after a real token
    ],
}


@pytest.mark.parametrize("arg", sorted(BAD_ARGS))
def test_each_bad_argument_is_named(model, arg):
    idx = torch.zeros(1, 4, dtype=torch.long)
    for value in BAD_ARGS[arg]:
        kwargs = {"max_new_tokens": 2, arg: value} if arg != "max_new_tokens" else {"max_new_tokens": value}
        with pytest.raises((TypeError, ValueError), match=arg):
            model.generate(idx, **kwargs)


@pytest.mark.parametrize(
    "idx,match",
    [
        ([[1, 2]], "torch.Tensor"),
        (torch.zeros(0, 3, dtype=torch.long), "zero-sized"),
        (torch.zeros(2, 0, dtype=torch.long), "zero-sized"),
        (torch.zeros(3, dtype=torch.long), r"\(B, T\)"),
        (torch.zeros(1, 3), "integer"),
        (torch.zeros(1, 3, dtype=torch.bool), "integer"),
        (torch.full((1, 3), VOCAB), "token ids"),
        (torch.full((1, 3), -1), "token ids"),
        (torch.zeros(1, BLOCK, dtype=torch.long), "block_size"),
    ],
)
def test_bad_prompts(model, idx, match):
    with pytest.raises((TypeError, ValueError), match=match):
        model.generate(idx, 1, context="error")  # the default context="slide" slides past block_size instead


def test_unknown_context_is_named(model):
    with pytest.raises(ValueError, match="context='wrap'"):
        model.generate(torch.zeros(1, 3, dtype=torch.long), 1, context="wrap")


@given(
    b=st.integers(1, 3),
    t=st.integers(1, 8),
    new=st.integers(0, 8),
    temperature=st.floats(0, 5),
    top_k=st.one_of(st.none(), st.integers(1, 2 * VOCAB)),
    seed=st.integers(0, 2**31 - 1),
)
def test_valid_arguments_generate(model, b, t, new, temperature, top_k, seed):
    idx = torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))
    greedy = temperature < GREEDY_BELOW
    out = model.generate(
        idx,
        new,
        temperature=temperature,
        top_k=None if greedy else top_k,
        generator=None if greedy else torch.Generator().manual_seed(seed),
    )
    assert out.shape == (b, t + new) and torch.equal(out[:, :t], idx)
    assert int(out.min()) >= 0 and int(out.max()) < VOCAB


@given(
    temperature=st.one_of(st.just(0.0), st.floats(0, GREEDY_BELOW, exclude_max=True)),
    top_k=st.one_of(st.none(), st.integers(1, 2 * VOCAB)),
    seed=st.one_of(st.none(), st.integers(0, 2**31 - 1)),
    sliding=st.booleans(),
)
def test_greedy_decoding_refuses_what_it_would_ignore(model, temperature, top_k, seed, sliding):
    """Greedy decoding (a temperature below float32's smallest normal number) samples nothing: ``top_k`` and
    ``generator`` are refused, naming the first given, and the tokens are those of plain greedy decoding without
    them (checked with the refusal bypassed, so the rule cannot refuse something that has an effect)."""
    idx = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(0))
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    decode = model.generate_sliding if sliding else model.generate
    plain = decode(idx, 4, temperature=temperature)
    if top_k is None and generator is None:
        assert torch.equal(plain, decode(idx, 4, temperature=0.0))
        return
    with pytest.raises(ValueError, match="top_k=" if top_k is not None else "generator="):
        decode(idx, 4, temperature=temperature, top_k=top_k, generator=generator)
    with mock.patch("coupled_qk.models.generation.check_greedy_extras"):
        assert torch.equal(decode(idx, 4, temperature=temperature, top_k=top_k, generator=generator), plain)


@given(
    top_p=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.text(max_size=3)),
    penalty=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.booleans()),
    stop=st.one_of(st.lists(st.integers(-5, 2 * VOCAB), max_size=3), st.text(max_size=3)),
)
def test_sampling_extras_contract(top_p, penalty, stop):
    """top_p, repetition_penalty, stop_ids (for the samplers that add them): valid or a named error, nothing else."""
    idx = torch.zeros(1, 2, dtype=torch.long)
    for name, kwargs in (
        ("top_p", {"top_p": top_p}),
        ("repetition_penalty", {"repetition_penalty": penalty}),
        ("stop_ids", {"stop_ids": stop}),
    ):
        try:
            check_generate_args(idx, 1, block_size=BLOCK, vocab_size=VOCAB, **kwargs)
        except (TypeError, ValueError) as exc:
            assert name in str(exc)
        else:
            value = kwargs[name]
            if name == "top_p":
                assert not isinstance(value, bool) and 0 < value <= 1
            elif name == "repetition_penalty":
                assert not isinstance(value, bool) and math.isfinite(value) and value > 0
            else:
                assert isinstance(value, list) and all(0 <= s < VOCAB for s in value)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(shared_across_heads="False"), "shared_across_heads"),
        (dict(keys_per_query_head="no"), "keys_per_query_head"),
        (dict(dt_init=math.nan), "dt_init"),
        (dict(dt_init=math.inf), "dt_init"),
        (dict(n_steps=1.0), "n_steps"),
        (dict(n_steps=True), "n_steps"),
        (dict(hidden=0), "hidden"),
    ],
)
def test_qk_dynamics_constructor(kwargs, match):
    with pytest.raises(ValueError, match=match):
        QKDynamics(8, 2, **kwargs)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(n_kv_heads=0), "n_kv_heads"),
        (dict(n_heads=2.0), "n_heads"),
        (dict(d_head=-1), "d_head"),
        (dict(use_rope="False"), "use_rope"),
        (dict(dropout=1.0), "dropout"),
        (dict(dropout=math.nan), "dropout"),
        (dict(layer_idx=-1), "layer_idx"),
    ],
)
def test_attention_constructor(kwargs, match):
    args = dict(d_model=16, n_heads=2, n_kv_heads=2, d_head=8)
    with pytest.raises(ValueError, match=match):
        CausalSelfAttention(**{**args, **kwargs})


# ------------------------------------------------------------------------- configs re-checked after construction

from coupled_qk.checks.values import field_types  # noqa: E402
from coupled_qk.training.config import TrainConfig  # noqa: E402

INT_BAD = [0, -1, 2.5, True, "x", "2.5", float("nan"), None]


@pytest.mark.parametrize("cls", [GPTConfig, TrainConfig])
def test_assignment_after_construction_is_checked(cls):
    """Every int/float field: a bad value assigned after construction is refused, naming the field, and the
    old value stays; a typo is an AttributeError, not a new attribute."""
    cfg = GPTConfig.from_preset("tiny") if cls is GPTConfig else TrainConfig(max_steps=10)
    for name, annotation in field_types(cls).items():
        text = str(annotation)
        if text not in ("int", "float", "<class 'int'>", "<class 'float'>"):
            continue
        old = getattr(cfg, name)
        bad = INT_BAD if "int" in text else [float("nan"), float("inf"), True, "x", None]
        for value in bad:
            try:
                setattr(cfg, name, value)
            except ValueError as exc:
                assert name in str(exc)
            else:  # accepted: only a value valid for that field (e.g. 0 for a seed or warmup)
                assert isinstance(getattr(cfg, name), type(old)) and not isinstance(getattr(cfg, name), bool)
                setattr(cfg, name, old)
            assert getattr(cfg, name) == old or getattr(cfg, name) == value
    with pytest.raises(AttributeError, match="no field"):
        cfg.n_layerz = 3


@pytest.mark.parametrize(
    "idx,error,match",
    [
        ([[1, 2]], TypeError, "torch.Tensor"),
        (torch.zeros(0, 3, dtype=torch.long), ValueError, "zero-sized"),
        (torch.zeros(2, 0, dtype=torch.long), ValueError, "zero-sized"),
        (torch.zeros(1, 3), ValueError, "integer"),
        (torch.full((1, 3), VOCAB), ValueError, "token ids"),
        (torch.zeros(1, BLOCK + 1, dtype=torch.long), ValueError, "block_size"),
    ],
)
def test_forward_entry_checks(model, idx, error, match):
    with pytest.raises(error, match=match):
        model(idx)

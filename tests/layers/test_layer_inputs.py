"""A user's own model calling the public layers and ops directly: wrong inputs are errors naming the argument,
empty batches and sequences work, and the meta-device init pattern leaves no uninitialised parameter."""

from __future__ import annotations

import pytest
import torch

from coupled_qk import CausalSelfAttention, QKDynamics, QueryMLP, integrate_qk
from coupled_qk.ops.rope import rope_tables

D_MODEL, H, HKV, DH, T = 32, 4, 2, 8, 6


def _layer(**kw) -> CausalSelfAttention:
    torch.manual_seed(0)
    return CausalSelfAttention(D_MODEL, H, HKV, DH, **{"qk_map": QKDynamics, **kw})


def _x(b=2, t=T, **kw) -> torch.Tensor:
    return torch.randn(b, t, D_MODEL, **kw)


ROPE = rope_tables(T, DH)
PAD = torch.tensor([[False, True, True, True, True, True], [True] * T])


@pytest.mark.parametrize(
    "call, error, match",
    [
        (
            lambda L: L(torch.randn(2, T, D_MODEL - 1), ROPE),
            ValueError,
            r"x must have shape \(B, T, d_model=32\); got \(2, 6, 31\)",
        ),
        (lambda L: L(torch.randn(T, D_MODEL), ROPE), ValueError, r"x must have shape .* got \(6, 32\)"),
        (
            lambda L: L(_x().half(), ROPE),
            ValueError,
            "x has dtype torch.float16 but the layer's parameters are torch.float32",
        ),
        (lambda L: L(_x().long(), ROPE), ValueError, "x must be a floating-point tensor; got dtype torch.int64"),
        (lambda L: L(_x(device="meta"), ROPE), ValueError, "x is on meta but the layer is on cpu"),
        (lambda L: L([[0.0]], ROPE), TypeError, "x must be a torch.Tensor"),
        (lambda L: L(_x()), TypeError, "rope must be the RoPE tables .* got NoneType"),
        (
            lambda L: L(_x(), rope_tables(T - 1, DH)),
            ValueError,
            r"rope's cos table must have shape .* \(6, 8\) .* got \(5, 8\)",
        ),
        (
            lambda L: L(_x(), ROPE, key_mask=PAD.float()),
            ValueError,
            "key_mask must be a bool tensor .* got dtype torch.float32",
        ),
        (
            lambda L: L(_x(), ROPE, key_mask=PAD.long()),
            ValueError,
            "key_mask must be a bool tensor .* got dtype torch.int64",
        ),
        (
            lambda L: L(_x(), ROPE, key_mask=torch.ones(T, T, dtype=torch.bool).tril()),
            ValueError,
            r"key_mask must have shape \(B, T_past \+ T\) with B=2 .* got \(6, 6\)",
        ),
        (lambda L: L(_x(), ROPE, key_mask=torch.ones(2, 1, T, T, dtype=torch.bool)), ValueError, r"got \(2, 1, 6, 6\)"),
        (
            lambda L: L(_x(), ROPE, key_mask=PAD[:, 1:]),
            ValueError,
            r"key_mask must have shape \(B, T_k\) with T_k=6 .* got \(2, 5\)",
        ),
    ],
)
def test_layer_names_the_wrong_input(call, error, match):
    """Each of these failed deep inside torch ("mat1 and mat2 shapes cannot be multiplied", "bitwise_and_cpu not
    implemented for 'Float'", "Value after * must be an iterable", a broadcasting error) naming no argument."""
    with pytest.raises(error, match=match):
        call(_layer())


def test_layer_refuses_rope_it_would_ignore_and_odd_rope_width():
    with pytest.raises(ValueError, match="rope was given but the layer was built with use_rope=False"):
        _layer(use_rope=False)(_x(), ROPE)
    with pytest.raises(ValueError, match="d_head=5 must be even"):
        CausalSelfAttention(D_MODEL, H, HKV, 5)


def test_layer_checks_can_be_turned_off_and_gpt_does():
    from coupled_qk import GPT, GPTConfig

    model = GPT(GPTConfig.from_preset("tiny", attention="coupled"))
    assert all(not block.attn.check_every_call for block in model.blocks)
    layer = _layer()
    layer.check_every_call = False
    with pytest.raises(RuntimeError):  # torch's own error: nothing checked
        layer(torch.randn(2, T, D_MODEL - 1), ROPE)


@pytest.mark.parametrize(
    "kw", [{}, {"qk_map": None}, {"scoring": "differential"}, {"impl": "eager"}, {"qk_map": QueryMLP}]
)
@pytest.mark.parametrize("b, t", [(0, 4), (2, 0), (0, 0)])
def test_layer_empty_batch_or_sequence(kw, b, t):
    """B = 0 or T = 0 was "cannot reshape tensor of 0 elements into shape [0, 6, -1, 8]"; now an empty output
    (and an empty gradient), on the fast and the eager path."""
    layer = _layer(**kw)
    rope = tuple(r[:t] for r in rope_tables(4, DH))
    x = _x(b, t, requires_grad=True)
    y = layer(x, rope)
    y_eager, _ = layer(x, rope, record=True)
    assert y.shape == y_eager.shape == (b, t, D_MODEL)
    y.sum().backward()
    assert x.grad.shape == x.shape


def test_query_mlp_names_a_dtype_mismatch_like_the_coupled_map():
    """QueryMLP with float16 inputs and float32 weights failed inside F.linear ("expected m1 and m2 to have the
    same dtype"); QKDynamics named it. Both now do, and autocast still admits it."""
    q = torch.randn(2, H, T, DH)
    for cls in (QKDynamics, QueryMLP):
        with pytest.raises(ValueError, match="q has dtype torch.float16 but the module's parameters are torch.float32"):
            cls(DH, H)(q.half(), q.half())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert QueryMLP(DH, H)(q.bfloat16(), q.bfloat16())[0].shape == q.shape


def test_integrate_qk_checks_its_tensors():
    """integrate_qk(q float32, k float64) returned float64 for both (q silently promoted); a Python float ``dt``
    was "'float' object has no attribute 'dim'"; ``group=0`` was accepted."""
    q, dt = torch.randn(2, H, T, DH), torch.full((H,), 0.1)
    with pytest.raises(
        ValueError, match="q and k must be floating-point tensors of one dtype .* q torch.float32 and k torch.float64"
    ):
        integrate_qk(q, q.double(), torch.tanh, dt)
    with pytest.raises(ValueError, match="got q torch.int64"):
        integrate_qk(q.long(), q.long(), torch.tanh, dt)
    with pytest.raises(TypeError, match=r"dt must be a torch.Tensor; got float \(wrap a number"):
        integrate_qk(q, q, torch.tanh, 0.1)
    with pytest.raises(ValueError, match="dt is on meta but q is on cpu"):
        integrate_qk(q, q, torch.tanh, dt.to("meta"))
    with pytest.raises(ValueError, match="group=0 must be a positive integer"):
        integrate_qk(q, q, torch.tanh, dt, group=0)
    q2, k2 = integrate_qk(q.double(), q.double(), torch.tanh, dt)  # float32 dt with float64 tensors: float64 out
    assert q2.dtype == k2.dtype == torch.float64
    q1, k1 = integrate_qk(q, q, torch.tanh, torch.tensor(0.1))  # a CPU scalar dt
    assert torch.allclose(q1, q + 0.1 * q) and torch.allclose(k1, q + 0.1 * torch.tanh(q))


def test_meta_device_init_then_reset_parameters_initialises_every_parameter():
    """The meta-device pattern (build on meta, ``to_empty``, every module's ``reset_parameters()``, as FSDP users
    do) left ``dt`` (and differential attention's lambdas) as uninitialised memory: the maps and the layer had no
    ``reset_parameters``."""

    def build():
        return torch.nn.ModuleList(
            [
                _layer(qk_map=lambda d, n: QKDynamics(d, n, dt_init=0.25), scoring="differential"),
                _layer(qk_map=lambda d, n: QueryMLP(d, n, dt_init=-0.5)),
            ]
        )

    with torch.device("meta"):
        model = build()
    model.to_empty(device="cpu")
    for p in model.parameters():
        p.data.fill_(float("nan"))  # what to_empty may leave
    torch.manual_seed(1)
    for m in model.modules():
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert torch.equal(model[0].qk_map.dt, torch.full((H,), 0.25))
    assert torch.equal(model[1].qk_map.dt, torch.full((H,), -0.5))
    lam = model[0].scorer.lambda_q1
    assert 0.02 < lam.std().item() < 0.3  # N(0, 0.1), as at construction
    assert torch.isfinite(model[0](_x(), ROPE)).all() and torch.isfinite(model[1](_x(), ROPE)).all()

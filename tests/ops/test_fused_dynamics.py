"""The fused one-step integrators against autograd of the reference integrator, in float64 and float32."""

import pytest
import torch

from coupled_qk import QKDynamics, integrate_qk
from coupled_qk.ops import fused_dynamics
from coupled_qk.ops.fused_dynamics import fused_available, fused_step, set_fused

INTEGRATORS = ["euler", "leapfrog", "symplectic_euler"]
B, H, T, D, HID = 2, 3, 5, 4, 6


def inputs(dtype=torch.float64, seed=0, strided=True):
    """q, k as the attention layer hands them over (strided head views of one QKV buffer), dt, weights."""
    g = torch.Generator().manual_seed(seed)
    buf = torch.randn(B, T, 3 * H * D, generator=g, dtype=dtype)
    q, k, _ = buf.split(H * D, dim=-1)
    q, k = (x.reshape(B, T, H, D).transpose(1, 2) for x in (q, k))
    if not strided:
        q, k = q.contiguous(), k.contiguous()
    dt = (0.3 * torch.randn(H, generator=g, dtype=dtype)).requires_grad_()
    w_in = torch.randn(HID, D, generator=g, dtype=dtype).requires_grad_()
    w_out = torch.randn(D, HID, generator=g, dtype=dtype).requires_grad_()
    return q.requires_grad_(), k.requires_grad_(), dt, w_in, w_out


def reference(q, k, dt, w_in, w_out, integrator):
    force = lambda x: torch.nn.functional.silu(x @ w_in.T) @ w_out.T  # noqa: E731
    return integrate_qk(q, k, force, dt, integrator, 1)


def values_and_grads(fn, args, seed=1):
    """Outputs of ``fn(*args)`` and the gradients of a random linear functional of both outputs."""
    args = [a.detach().clone().requires_grad_() for a in args]
    q2, k2 = fn(*args)
    g = torch.Generator().manual_seed(seed)
    up_q, up_k = (torch.randn(x.shape, generator=g, dtype=x.dtype) for x in (q2, k2))
    grads = torch.autograd.grad((q2 * up_q).sum() + (k2 * up_k).sum(), args)
    return (q2.detach(), k2.detach()), grads


@pytest.mark.parametrize("integrator", INTEGRATORS)
@pytest.mark.parametrize("strided", [True, False])
def test_fused_equals_reference_float64(integrator, strided):
    q, k, dt, w_in, w_out = inputs(strided=strided)
    (fq, fk), f_grads = values_and_grads(lambda *a: fused_step(*a, integrator), (q, k, dt, w_in, w_out))
    (rq, rk), r_grads = values_and_grads(
        lambda q, k, dt, w_in, w_out: reference(q, k, dt, w_in, w_out, integrator), (q, k, dt, w_in, w_out))
    torch.testing.assert_close(fq, rq, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fk, rk, rtol=1e-12, atol=1e-12)
    for name, a, b in zip(("q", "k", "dt", "w_in", "w_out"), f_grads, r_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=lambda m, n=name: f"grad of {n}: {m}")


@pytest.mark.parametrize("integrator", INTEGRATORS)
def test_fused_gradcheck(integrator):
    q, k, dt, w_in, w_out = inputs(seed=3)
    assert torch.autograd.gradcheck(lambda *a: fused_step(*a, integrator), (q, k, dt, w_in, w_out))


@pytest.mark.parametrize("integrator", INTEGRATORS)
def test_fused_with_one_output_unused(integrator):
    """Only q' reaches the loss (k' gets no gradient): the missing upstream gradient counts as zero."""
    q, k, dt, w_in, w_out = inputs(seed=4)
    grads = torch.autograd.grad(fused_step(q, k, dt, w_in, w_out, integrator)[0].sum(), (q, k, dt, w_in))
    ref = torch.autograd.grad(reference(q, k, dt, w_in, w_out, integrator)[0].sum(), (q, k, dt, w_in),
                              allow_unused=True)
    for a, b in zip(grads, ref):
        torch.testing.assert_close(a, torch.zeros_like(a) if b is None else b, rtol=1e-10, atol=1e-10)


def test_dt_zero_is_the_identity_and_standard_gradients():
    q, k, dt, w_in, w_out = inputs(seed=5)
    dt = torch.zeros_like(dt, requires_grad=True)
    q2, k2 = fused_step(q, k, dt, w_in, w_out, "leapfrog")
    assert torch.equal(q2, q) and torch.equal(k2, k)
    gq, gw = torch.autograd.grad(q2.sum() + k2.sum(), (q, w_in))
    assert torch.equal(gq, torch.ones_like(q)) and torch.equal(gw, torch.zeros_like(gw))


@pytest.mark.parametrize("integrator", INTEGRATORS)
def test_qkdynamics_fused_matches_unfused_float32(integrator):
    """The module takes the fused path by default; turning it off gives the reference to fp32 rounding."""
    torch.manual_seed(0)
    m = QKDynamics(D, H, integrator=integrator, hidden=HID, dt_init=0.2)
    q, k, *_ = inputs(dtype=torch.float32, seed=6)
    fused = values_and_grads(lambda q, k: m(q, k), (q, k))
    fused_params = torch.autograd.grad(sum(x.sum() for x in m(q, k)), list(m.parameters()))
    previous = set_fused(False)
    try:
        ref = values_and_grads(lambda q, k: m(q, k), (q, k))
        ref_params = torch.autograd.grad(sum(x.sum() for x in m(q, k)), list(m.parameters()))
    finally:
        set_fused(previous)
    for a, b in zip([*fused[0], *fused[1], *fused_params], [*ref[0], *ref[1], *ref_params]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_module_routes_through_the_fused_function(monkeypatch):
    """Guard against the fast path silently never running: count the calls."""
    calls = []
    original = fused_dynamics._Euler.apply
    monkeypatch.setattr(fused_dynamics._Euler, "apply", lambda *a: calls.append(1) or original(*a))
    m = QKDynamics(D, H)
    q, k, *_ = inputs(dtype=torch.float32)
    m(q, k)
    assert len(calls) == 1
    QKDynamics(D, H, n_steps=2)(q, k)  # two steps: the reference path
    QKDynamics(D, H, shared_across_heads=False)(q, k)  # per-head force: the reference path
    assert len(calls) == 1


def test_availability_rules():
    q, k, dt, w_in, _ = inputs(dtype=torch.float32)
    assert fused_available(q, k, w_in, dt)
    assert not fused_available(q, k[:, :1], w_in, dt)  # shared keys (fewer key heads)
    assert not fused_available(q.double(), k.double(), w_in, dt)  # dtype mismatch
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not fused_available(q, k, w_in, dt)
    previous = set_fused(False)
    try:
        assert not fused_available(q, k, w_in, dt)
    finally:
        set_fused(previous)


def test_bad_arguments_name_the_problem():
    q, k, dt, w_in, w_out = inputs()
    with pytest.raises(ValueError, match="integrator='rk4'"):
        fused_step(q, k, dt, w_in, w_out, "rk4")
    with pytest.raises(ValueError, match="dt of shape"):
        fused_step(q, k, dt[:2], w_in, w_out)
    with pytest.raises(ValueError, match="one dtype"):
        fused_step(q, k.float(), dt, w_in, w_out)


@pytest.mark.parametrize("integrator", INTEGRATORS)
def test_no_grad_forward_equals_reference(integrator):
    """Decoding takes the plain forward (no autograd node): same values."""
    q, k, dt, w_in, w_out = inputs(seed=7)
    with torch.no_grad():
        got = fused_step(q, k, dt, w_in, w_out, integrator)
        want = reference(q, k, dt, w_in, w_out, integrator)
    assert not got[0].requires_grad
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)

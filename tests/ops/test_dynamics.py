"""Integrators against independent float64 formulas, Jacobian determinants and energy conservation."""

import pytest
import torch

from coupled_qk import GradientForce, MLPForce, QKDynamics, integrate_qk
from coupled_qk.ops.reference import integrate_qk_reference

torch.manual_seed(0)
B, H, T, D = 2, 3, 5, 4


def random_force(d=D, hidden=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(hidden, d, generator=g, dtype=torch.float64)
    w2 = torch.randn(d, hidden, generator=g, dtype=torch.float64)
    return lambda x: torch.nn.functional.silu(x @ w1.T) @ w2.T


@pytest.mark.parametrize("integrator", ["euler", "leapfrog", "symplectic_euler"])
@pytest.mark.parametrize("n", [1, 2, 5])
def test_integrators_match_formulas(integrator, n):
    q = torch.randn(B, H, T, D, dtype=torch.float64)
    k = torch.randn(B, H, T, D, dtype=torch.float64)
    dt = torch.rand(H, dtype=torch.float64) * 0.5 - 0.1
    f = random_force()
    q2, k2 = integrate_qk(q, k, f, dt, integrator, n)
    qr, kr = integrate_qk_reference(q, k, f, dt, integrator, n)
    torch.testing.assert_close(q2, qr, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(k2, kr, rtol=1e-12, atol=1e-12)


def test_euler_one_step_by_hand():
    # f(q) = 2q (a linear force written by hand), dt = 0.5: q' = q + k/2, k' = k + q
    q = torch.tensor([[[[1.0, -2.0]]]], dtype=torch.float64)
    k = torch.tensor([[[[3.0, 4.0]]]], dtype=torch.float64)
    q2, k2 = integrate_qk(q, k, lambda x: 2 * x, torch.tensor([0.5], dtype=torch.float64), "euler", 1)
    assert q2.flatten().tolist() == [2.5, 0.0]
    assert k2.flatten().tolist() == [4.0, 2.0]
    qr, kr = integrate_qk_reference(q, k, lambda x: 2 * x, torch.tensor([0.5], dtype=torch.float64), "euler", 1)
    assert qr.flatten().tolist() == [2.5, 0.0] and kr.flatten().tolist() == [4.0, 2.0]  # the reference too


@pytest.mark.parametrize("integrator", ["euler", "leapfrog", "symplectic_euler"])
def test_dt_zero_and_zero_steps_are_identity(integrator):
    dyn = QKDynamics(D, H, integrator=integrator, dt_init=0.0, n_steps=3)
    q, k = torch.randn(B, H, T, D), torch.randn(B, H, T, D)
    q2, k2 = dyn(q, k)
    assert torch.equal(q2, q) and torch.equal(k2, k)
    dyn = QKDynamics(D, H, integrator=integrator, dt_init=0.3, n_steps=0)
    q2, k2 = dyn(q, k)
    assert torch.equal(q2, q) and torch.equal(k2, k)


def one_token_map(integrator, f, dt, n=1):
    def phi(z):
        q, k = z[:D].view(1, 1, 1, D), z[D:].view(1, 1, 1, D)
        q2, k2 = integrate_qk(q, k, f, torch.tensor([dt], dtype=torch.float64), integrator, n)
        return torch.cat([q2.flatten(), k2.flatten()])

    return phi


@pytest.mark.parametrize("integrator", ["leapfrog", "symplectic_euler"])
def test_symplectic_integrators_preserve_volume(integrator):
    f = random_force(seed=3)
    z = torch.randn(2 * D, dtype=torch.float64)
    for n in (1, 4):
        jac = torch.autograd.functional.jacobian(one_token_map(integrator, f, 0.7, n), z)
        assert abs(torch.linalg.det(jac).item() - 1.0) < 1e-10


def test_euler_jacobian_determinant_formula():
    f = random_force(seed=4)
    z = torch.randn(2 * D, dtype=torch.float64)
    dt = 0.7
    jac = torch.autograd.functional.jacobian(one_token_map("euler", f, dt), z)
    jf = torch.autograd.functional.jacobian(f, z[:D])
    expected = torch.linalg.det(torch.eye(D, dtype=torch.float64) - dt**2 * jf)
    det = torch.linalg.det(jac)
    assert abs(det.item() - 1.0) > 1e-3  # Euler is not volume preserving
    assert abs(det.item() - expected.item()) < 1e-10


def test_gradient_force_is_minus_grad_potential():
    force = GradientForce(D, 7).double()
    q = torch.randn(B, H, T, D, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(force.potential(q).sum(), q)
    torch.testing.assert_close(force(q), -grad, rtol=1e-12, atol=1e-12)
    per_head = GradientForce(D, 7, n_heads=H).double()
    (grad,) = torch.autograd.grad(per_head.potential(q).sum(), q)
    torch.testing.assert_close(per_head(q), -grad, rtol=1e-12, atol=1e-12)


def test_leapfrog_conserves_energy_to_second_order():
    force = GradientForce(D, 8).double()
    q0 = torch.randn(1, 1, 16, D, dtype=torch.float64)
    k0 = torch.randn(1, 1, 16, D, dtype=torch.float64)

    def energy(q, k):
        return 0.5 * (k**2).sum(-1) + force.potential(q)

    errors = []
    for dt in (0.02, 0.01):
        n = int(round(2.0 / dt))
        q, k = integrate_qk(q0, k0, force, torch.tensor([dt], dtype=torch.float64), "leapfrog", n)
        errors.append((energy(q, k) - energy(q0, k0)).abs().max().item())
    assert errors[0] < 1e-2
    ratio = errors[0] / errors[1]
    assert 3.0 < ratio < 5.5, errors  # halving dt divides the energy error by ~4: O(dt^2)


def test_per_head_force_matches_loop_over_heads():
    force = MLPForce(D, 5, n_heads=H).double()
    q = torch.randn(B, H, T, D, dtype=torch.float64)
    out = force(q)
    for h in range(H):
        ref = torch.nn.functional.silu(q[:, h] @ force.w_in[h].T) @ force.w_out[h].T
        torch.testing.assert_close(out[:, h], ref)


def test_module_exposes_force_and_dt():
    dyn = QKDynamics(16, 4, hidden=8)
    assert dyn.dt.shape == (4,) and isinstance(dyn.dt, torch.nn.Parameter)
    assert dyn.force(torch.randn(3, 16)).shape == (3, 16)
    assert sum(p.numel() for p in dyn.force.parameters()) == 2 * 16 * 8
    dyn = QKDynamics(16, 4, shared_across_heads=False)
    assert sum(p.numel() for p in dyn.force.parameters()) == 4 * 2 * 16 * 16


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(integrator="rk4"), "integrator"),
        (dict(n_steps=-1), "n_steps"),
        (dict(dt_init=float("nan")), "dt_init"),
        (dict(hidden=0), "hidden"),
        (dict(force="spring"), "force"),
    ],
)
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        QKDynamics(D, H, **kwargs)


def test_bad_inputs():
    dyn = QKDynamics(D, H)
    with pytest.raises(ValueError, match="shape"):
        dyn(torch.randn(H, T, D), torch.randn(H, T, D))
    with pytest.raises(ValueError, match="differ"):
        dyn(torch.randn(B, H, T, D), torch.randn(B, H, T + 1, D))
    with pytest.raises(ValueError, match="heads"):
        dyn(torch.randn(B, H + 1, T, D), torch.randn(B, H + 1, T, D))
    with torch.no_grad():
        dyn.dt[0] = float("inf")
    with pytest.raises(ValueError, match="dt must be finite"):
        dyn(torch.randn(B, H, T, D), torch.randn(B, H, T, D))
    with pytest.raises(ValueError, match="dtype torch.float64"):
        dyn(torch.randn(B, H, T, D, dtype=torch.float64), torch.randn(B, H, T, D, dtype=torch.float64))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # mixed precision is fine under autocast
        q2, _ = QKDynamics(D, H)(torch.randn(B, H, T, D).bfloat16(), torch.randn(B, H, T, D).bfloat16())
    assert q2.shape == (B, H, T, D)
    with pytest.raises(ValueError, match="dt has"):
        integrate_qk(torch.randn(B, H, T, D), torch.randn(B, H, T, D), lambda x: x, torch.zeros(H + 1))


@pytest.mark.parametrize(
    "make",
    [
        lambda: QKDynamics(D, H),
        lambda: QKDynamics(D, H, integrator="leapfrog"),
        lambda: __import__("coupled_qk.models.maps.query_mlp", fromlist=["QueryMLP"]).QueryMLP(D, H),
        lambda: __import__("coupled_qk.models.maps.invertible", fromlist=["InvertibleQKCoupling"]).InvertibleQKCoupling(
            D, H
        ),
    ],
    ids=["euler", "leapfrog", "query_mlp", "invertible"],
)
@pytest.mark.parametrize("k_dtype", [torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.bool])
def test_every_map_refuses_a_key_of_another_dtype(make, k_dtype):
    """``dyn(q, k.double())`` returned float64 outputs and ``k.long()`` was accepted: every map's first check
    (``check_qk_tensors``) now wants floating-point q and k of one dtype, naming both."""
    q = torch.randn(B, H, T, D)
    k = torch.randn(B, H, T, D).to(k_dtype)
    match = "k must be a floating-point tensor" if not k.is_floating_point() else "q and k dtypes differ"
    with pytest.raises(ValueError, match=match):
        make()(q, k)
    q_out, k_out = make()(q, k.float() if k.is_floating_point() else torch.randn(B, H, T, D))
    assert q_out.dtype == k_out.dtype == torch.float32

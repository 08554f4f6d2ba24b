"""Integrators for coupled query-key dynamics (arXiv:2604.01683v1, section "Coupled QK dynamics").

Pure functions on tensors. The query ``q`` is read as a position, the key ``k`` as a momentum and the
coupling network ``force`` as a force field acting on the query. Everything acts on the last axis; ``dt``
broadcasts against the head axis of ``(B, H, T, d_head)`` tensors.

One step of each integrator (``f = force``):

- ``euler`` (the paper's Euler map, both right-hand sides at step t)::

      q' = q + dt * k
      k' = k + dt * f(q)

- ``leapfrog`` (kick-drift-kick Stormer-Verlet, the paper's Hamiltonian integrator)::

      k_half = k + dt/2 * f(q)
      q'     = q + dt * k_half
      k'     = k_half + dt/2 * f(q')

- ``symplectic_euler`` (kick then drift; beyond the paper)::

      k' = k + dt * f(q)
      q' = q + dt * k'

Each sub-step of ``leapfrog`` and ``symplectic_euler`` is a shear, so their Jacobian determinant is exactly 1
for any ``f``; the Euler map's is ``det(I - dt^2 J_f)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

INTEGRATORS = ("euler", "leapfrog", "symplectic_euler")

Force = Callable[[torch.Tensor], torch.Tensor]


def check_integrator(integrator: str) -> str:
    """Return ``integrator`` if it names a known integrator.

    Raises:
        ValueError: if ``integrator`` is not one of :data:`INTEGRATORS`.
    """
    if integrator not in INTEGRATORS:
        raise ValueError(f"integrator={integrator!r} is not supported; expected one of {INTEGRATORS}")
    return integrator


def integrate_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    force: Force,
    dt: torch.Tensor,
    integrator: str = "euler",
    n_steps: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Evolve a query-key pair for ``n_steps`` steps of coupled dynamics.

    Args:
        q: queries, shape ``(..., H, T, d_head)``, any float dtype.
        k: keys, same shape and dtype as ``q`` (with grouped-query attention, expand keys to the query
            heads first).
        force: callable mapping ``(..., H, T, d_head) -> (..., H, T, d_head)``: the coupling network ``f``.
        dt: step sizes, shape ``(H,)`` (one per head) or a scalar tensor; dimensionless.
        integrator: ``"euler"``, ``"leapfrog"`` or ``"symplectic_euler"`` (see the module docstring).
        n_steps: number of steps (``>= 0``); ``n`` steps compose the one-step map, ``0`` is the identity.

    Returns:
        ``(q_n, k_n)``, the evolved pair, same shapes and dtype as the inputs.

    Raises:
        ValueError: on mismatched shapes, a ``dt`` whose length is not the head count, a negative or
            non-integer ``n_steps``, or an unknown integrator.

    Source: arXiv:2604.01683v1 (Euler and Hamiltonian/leapfrog updates); Hairer, Lubich & Wanner,
    *Geometric Numerical Integration* (2006), for the Stormer-Verlet and symplectic Euler schemes.
    """
    check_integrator(integrator)
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape; got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if q.dim() < 3:
        raise ValueError(f"q must have shape (..., H, T, d_head); got {tuple(q.shape)}")
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 0:
        raise ValueError(f"n_steps={n_steps!r} must be an integer >= 0")
    n_heads = q.shape[-3]
    if dt.dim() == 1:
        if dt.shape[0] != n_heads:
            raise ValueError(f"dt has {dt.shape[0]} entries but q has {n_heads} heads (axis -3)")
        dt = dt.view(n_heads, 1, 1)
    elif dt.dim() != 0:
        raise ValueError(f"dt must be a scalar or have shape (n_heads,); got {tuple(dt.shape)}")
    dt = dt.to(q.dtype)

    if n_steps == 0:
        return q, k
    # torch.addcmul(x, dt, y) = x + dt * y in one kernel (fewer temporaries forward and backward)
    if integrator == "euler":
        for _ in range(n_steps):
            q, k = torch.addcmul(q, dt, k), torch.addcmul(k, dt, force(q))
        return q, k
    if integrator == "symplectic_euler":
        for _ in range(n_steps):
            k = torch.addcmul(k, dt, force(q))
            q = torch.addcmul(q, dt, k)
        return q, k
    # leapfrog: the closing half-kick of one step and the opening half-kick of the next share f(q),
    # so n steps cost n + 1 force evaluations.
    half = 0.5 * dt
    f_q = force(q)
    for _ in range(n_steps):
        k = torch.addcmul(k, half, f_q)
        q = torch.addcmul(q, dt, k)
        f_q = force(q)
        k = torch.addcmul(k, half, f_q)
    return q, k


def apply_query_mlp(q: torch.Tensor, mlp: Force, dt: torch.Tensor) -> torch.Tensor:
    """Uncoupled baseline: ``q' = q + dt * g(q)`` (keys untouched).

    Args:
        q: queries ``(..., H, T, d_head)``.
        mlp: callable ``(..., H, T, d_head) -> (..., H, T, d_head)``, the query-only network ``g``.
        dt: ``(H,)`` step sizes.

    Returns:
        Tensor of the shape and dtype of ``q``.

    Source: arXiv:2604.01683v1, the "uncoupled MLP of matched capacity" ablation.
    """
    if dt.dim() != 1 or dt.shape[0] != q.shape[-3]:
        raise ValueError(f"dt must have shape ({q.shape[-3]},) to match the heads of q; got {tuple(dt.shape)}")
    return q + dt.to(q.dtype).view(-1, 1, 1) * mlp(q)

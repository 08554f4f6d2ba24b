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

Shared keys under grouped-query attention (beyond the paper; docs/METHOD.md section 1.1): when ``k`` has
``H_kv < H`` heads, each key/value head keeps *one* evolved key for the ``n_rep = H / H_kv`` query heads of its
group. Write ``M(x)`` for the group mean over those query heads and ``E(k)`` for the key repeated to them
(:mod:`coupled_qk.ops.heads`); ``dt_q`` is the query head's own step and ``dt_k = M(dt)`` the group's mean step:

- ``euler``:            ``q' = q + dt_q E(k)``,  ``k' = k + dt_k f(M(q))``
- ``symplectic_euler``: ``k' = k + dt_k f(M(q))``,  ``q' = q + dt_q E(k')``
- ``leapfrog``:         ``k_half = k + dt_k/2 f(M(q))``,  ``q' = q + dt_q E(k_half)``,
  ``k' = k_half + dt_k/2 f(M(q'))``

With ``H_kv == H`` (``M`` and ``E`` the identity) these are exactly the per-head rules above. The force is
evaluated on ``H_kv`` heads, so a per-head force network cannot be used (one network per query head).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from coupled_qk.ops.heads import expand_kv, group_mean

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


def _check_tensors(q: torch.Tensor, k: torch.Tensor, dt: torch.Tensor) -> None:
    """``q``, ``k`` floating tensors of one dtype and device; ``dt`` a tensor there (or a CPU scalar tensor)."""
    for name, t in (("q", q), ("k", k), ("dt", dt)):
        if not isinstance(t, torch.Tensor):
            hint = " (wrap a number: torch.tensor(0.1))" if name == "dt" else ""
            raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}{hint}")
    if not q.is_floating_point() or k.dtype != q.dtype:
        raise ValueError(
            f"q and k must be floating-point tensors of one dtype (outputs keep it); got q {q.dtype} and k {k.dtype}"
        )
    if k.device != q.device:
        raise ValueError(f"q is on {q.device} but k is on {k.device}; move one there")
    if dt.device != q.device and not (dt.dim() == 0 and dt.device.type == "cpu"):
        raise ValueError(f"dt is on {dt.device} but q is on {q.device}; move it there")


def _check_integrate_args(
    q: torch.Tensor, k: torch.Tensor, dt: torch.Tensor, integrator: str, n_steps: int, group: int
) -> None:
    """The argument checks of :func:`integrate_qk` (errors documented there)."""
    check_integrator(integrator)
    _check_tensors(q, k, dt)
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ValueError(f"group={group!r} must be a positive integer (sub-heads per head)")
    if q.dim() < 3:
        raise ValueError(f"q must have shape (..., H, T, d_head); got {tuple(q.shape)}")
    n_rep = q.shape[-3] // k.shape[-3] if k.dim() == q.dim() and k.shape[-3] else 0
    same_rest = k.dim() == q.dim() and k.shape[:-3] + k.shape[-2:] == q.shape[:-3] + q.shape[-2:]
    if not same_rest or n_rep * k.shape[-3] != q.shape[-3]:
        raise ValueError(
            f"q and k must have the same shape, or k fewer heads (axis -3) dividing q's; got q {tuple(q.shape)} "
            f"and k {tuple(k.shape)}"
        )
    if n_rep > 1 and k.shape[-3] % group:
        raise ValueError(f"group={group} must divide the key heads {k.shape[-3]}")
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 0:
        raise ValueError(f"n_steps={n_steps!r} must be an integer >= 0")
    n_heads = q.shape[-3]
    if dt.dim() == 1:
        if dt.shape[0] != n_heads:
            raise ValueError(f"dt has {dt.shape[0]} entries but q has {n_heads} heads (axis -3)")
    elif dt.dim() != 0:
        raise ValueError(f"dt must be a scalar or have shape (n_heads,); got {tuple(dt.shape)}")


def integrate_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    force: Force,
    dt: torch.Tensor,
    integrator: str = "euler",
    n_steps: int = 1,
    group: int = 1,
    check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Evolve a query-key pair for ``n_steps`` steps of coupled dynamics.

    Args:
        q: queries, shape ``(..., H, T, d_head)``, any float dtype.
        k: keys of the same dtype, shape ``(..., H, T, d_head)`` (one key per query head: the paper's rule) or
            ``(..., H_kv, T, d_head)`` with ``H_kv`` dividing ``H`` (keys shared by the query heads of a
            grouped-query group; see the module docstring).
        force: callable mapping ``(..., H, T, d_head) -> (..., H, T, d_head)``: the coupling network ``f``.
        dt: step sizes, shape ``(H,)`` (one per head) or a scalar tensor; dimensionless.
        integrator: ``"euler"``, ``"leapfrog"`` or ``"symplectic_euler"`` (see the module docstring).
        n_steps: number of steps (``>= 0``); ``n`` steps compose the one-step map, ``0`` is the identity.
        group: sub-heads per head of the grouped layout (:mod:`coupled_qk.ops.heads`; 2 for differential
            attention); only used when ``k`` has fewer heads than ``q``.
        check: validate the arguments (``False`` skips the Python-side checks below, for a caller that has
            validated them once, e.g. a decoding loop; wrong inputs then fail inside PyTorch or silently).

    Returns:
        ``(q_n, k_n)``, the evolved pair, same shapes and dtype as the inputs.

    Raises:
        TypeError: ``q``, ``k`` or ``dt`` not a tensor (a Python number for ``dt``: wrap it in ``torch.tensor``).
        ValueError: on mismatched shapes, ``q`` and ``k`` of different dtypes (a float32 ``q`` became float64
            with a float64 ``k``) or not floating point, tensors on different devices, a ``dt`` whose length is
            not the head count, a negative or non-integer ``n_steps``, a ``group`` that is not a positive
            integer, or an unknown integrator.

    Source: arXiv:2604.01683v1 (Euler and Hamiltonian/leapfrog updates); Hairer, Lubich & Wanner,
    *Geometric Numerical Integration* (2006), for the Stormer-Verlet and symplectic Euler schemes.
    """
    if check:
        _check_integrate_args(q, k, dt, integrator, n_steps, group)
    n_rep = q.shape[-3] // k.shape[-3]
    if dt.dim() == 1:
        dt = dt.view(-1, 1, 1)
    if dt.dtype != q.dtype:
        dt = dt.to(q.dtype)
    dt_k = dt if dt.dim() == 0 else group_mean(dt, n_rep, group)  # the key's step: its group's mean dt

    def kick(x: torch.Tensor) -> torch.Tensor:  # force on the (group-mean) query
        return force(group_mean(x, n_rep, group))

    def drift(x: torch.Tensor) -> torch.Tensor:  # the key seen by each query head
        return expand_kv(x, n_rep, group)

    if n_steps == 0:
        return q, k
    # torch.addcmul(x, dt, y) = x + dt * y in one kernel (fewer temporaries forward and backward)
    if integrator == "euler":
        for _ in range(n_steps):
            q, k = torch.addcmul(q, dt, drift(k)), torch.addcmul(k, dt_k, kick(q))
        return q, k
    if integrator == "symplectic_euler":
        for _ in range(n_steps):
            k = torch.addcmul(k, dt_k, kick(q))
            q = torch.addcmul(q, dt, drift(k))
        return q, k
    # leapfrog: the closing half-kick of one step and the opening half-kick of the next share f(q),
    # so n steps cost n + 1 force evaluations.
    half = 0.5 * dt_k
    f_q = kick(q)
    for _ in range(n_steps):
        k = torch.addcmul(k, half, f_q)
        q = torch.addcmul(q, dt, drift(k))
        f_q = kick(q)
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

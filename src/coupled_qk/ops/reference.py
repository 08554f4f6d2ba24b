"""Plain float64 references of the ops, written for reading, not for speed: the math and its check in one place.

Each function restates a formula of docs/METHOD.md (the paper's equations, PAPER.md section 1) as a loop over
heads or an explicit expression, independent of the vectorised code it checks (the way flash-linear-attention
keeps ``naive.py`` beside each kernel). The tests compare the library against these in float64:

- :func:`integrate_qk_reference`: the three integrators of :mod:`coupled_qk.ops.dynamics`, per head;
- :func:`integrate_qk_shared_reference`: the shared-key rule of grouped-query attention (docs/METHOD.md
  section 1.1), per key/value head;
- :func:`rope_reference`: rotary position embedding (:mod:`coupled_qk.ops.rope`, half-split layout);
- :func:`rms_norm_reference`: RMSNorm with a weight (the sub-layer norm of differential attention).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["integrate_qk_reference", "integrate_qk_shared_reference", "rms_norm_reference", "rope_reference"]

Force = Callable[[torch.Tensor], torch.Tensor]


def integrate_qk_reference(
    q: torch.Tensor, k: torch.Tensor, f: Force, dt: torch.Tensor, integrator: str, n_steps: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n_steps`` steps of the coupled dynamics, one head at a time (docs/METHOD.md section 1; arXiv:2604.01683v1).

    Per head ``h`` with step ``d = dt[h]``: Euler ``q' = q + d k, k' = k + d f(q)``; leapfrog (kick-drift-kick)
    ``k_half = k + d/2 f(q), q' = q + d k_half, k' = k_half + d/2 f(q')``; symplectic Euler
    ``k' = k + d f(q), q' = q + d k'``.

    Args:
        q, k: ``(B, H, T, d_head)``, any float dtype (float64 for a reference).
        f: the force, ``(..., d_head) -> (..., d_head)``, applied to one head's queries ``(B, T, d_head)``.
        dt: ``(H,)`` steps.
        integrator: ``"euler"``, ``"leapfrog"`` or ``"symplectic_euler"``.
        n_steps: steps (>= 0).

    Returns:
        ``(q', k')`` of the input shapes (new tensors; the inputs are not modified).

    Raises:
        ValueError: an unknown integrator.
    """
    if integrator not in ("euler", "leapfrog", "symplectic_euler"):
        raise ValueError(f"integrator={integrator!r}; expected euler, leapfrog or symplectic_euler")
    q, k = q.clone(), k.clone()
    for _ in range(n_steps):
        for h in range(q.shape[1]):
            qh, kh, d = q[:, h], k[:, h], float(dt[h])
            if integrator == "euler":
                q[:, h], k[:, h] = qh + d * kh, kh + d * f(qh)
            elif integrator == "leapfrog":
                k_half = kh + d / 2 * f(qh)
                q_new = qh + d * k_half
                q[:, h], k[:, h] = q_new, k_half + d / 2 * f(q_new)
            else:
                k_new = kh + d * f(qh)
                q[:, h], k[:, h] = qh + d * k_new, k_new
    return q, k


def integrate_qk_shared_reference(
    q: torch.Tensor, k: torch.Tensor, force: Force, dt: torch.Tensor, integrator: str, n_rep: int, group: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step with one evolved key per key/value head (``keys_per_query_head=False``; docs/METHOD.md section
    1.1), written out per head in float64.

    Query head ``j`` reads key/value head ``kv_of[j] = group * ((j // group) // n_rep) + j % group``; each key
    is kicked by the force of the mean query of its members with the mean of their steps; queries drift with
    their own step and their key.

    Args:
        q: ``(B, H, T, d)`` with ``H = n_rep * H_k``; k: ``(B, H_k, T, d)``.
        force: ``(B, T, d) -> (B, T, d)``.
        dt: ``(H,)``.
        integrator: ``"euler"``, ``"leapfrog"`` or ``"symplectic_euler"``.
        n_rep: query heads per key/value head; group: sub-heads per head (2 for differential attention).

    Returns:
        ``(q', k')`` in float64, shapes of the inputs.
    """
    q, k, dt = q.double(), k.double(), dt.double()
    h, hk = q.shape[1], k.shape[1]
    kv_of = [group * ((j // group) // n_rep) + j % group for j in range(h)]
    members = [[j for j in range(h) if kv_of[j] == g] for g in range(hk)]
    dtk = torch.stack([dt[m].mean() for m in members])

    def kick(qq: torch.Tensor) -> torch.Tensor:
        return torch.stack([force(qq[:, m].mean(1)) for m in members], 1)

    def drift(kk: torch.Tensor) -> torch.Tensor:
        return torch.stack([kk[:, kv_of[j]] for j in range(h)], 1)

    def scale(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return x * s.view(1, -1, 1, 1)

    if integrator == "euler":
        return q + scale(drift(k), dt), k + scale(kick(q), dtk)
    if integrator == "symplectic_euler":
        k = k + scale(kick(q), dtk)
        return q + scale(drift(k), dt), k
    k = k + scale(kick(q), dtk / 2)
    q = q + scale(drift(k), dt)
    return q, k + scale(kick(q), dtk / 2)


def rope_reference(x: torch.Tensor, base: float = 10000.0, start: int = 0) -> torch.Tensor:
    """Rotary position embedding of positions ``start .. start+T-1`` in float64, half-split layout (Su et al. 2021):
    ``[x1 cos - x2 sin, x2 cos + x1 sin]`` with angles ``t * base^(-2i/d)``.

    Args:
        x: ``(..., T, d)`` with ``d`` even.
        base: frequency base (> 0).
        start: position of the first row (>= 0).

    Returns:
        The rotated tensor, float64, shape of ``x``.
    """
    t, d = x.shape[-2], x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(start, start + t, dtype=torch.float64)[:, None] * inv[None]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    c, s = ang.cos(), ang.sin()
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """RMSNorm ``x / sqrt(mean(x^2) + eps) * weight`` over the last axis (Zhang & Sennrich 2019)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

"""One fused step of coupled query-key dynamics with a hand-derived backward (issue 12, item 4).

The same maps as :func:`coupled_qk.ops.dynamics.integrate_qk` (``n_steps=1``, one key per query head) with the
paper's force ``f(q) = W2 silu(W1 q)`` shared by all heads, written as one ``torch.autograd.Function`` per
integrator. Autograd of the reference builds about 12 nodes per step; here the chain rule is written out once:

- everything runs in the token-major layout ``(B, T, H, d_head)`` in which the QKV projection produces the
  queries and keys and SDPA returns their gradients, so no elementwise pass runs on a strided view (about
  2.5x slower on CPU) and no gradient is copied to another layout;
- per force evaluation only ``s = sigmoid(h)`` and ``a = silu(h)`` are kept (as many tensors as autograd
  keeps); ``silu'(h) = s + a (1 - s)`` needs no second exponential, and ``<g, f> = <g W2, a>`` gives the
  ``dt`` gradient without keeping ``f``.

Values and gradients equal the reference up to floating-point rounding (tested in float64 against
:func:`~coupled_qk.ops.dynamics.integrate_qk` and with ``torch.autograd.gradcheck``). Without gradients
(decoding) the same forward runs as plain tensor operations.

Backward of one kick ``y = c f(x)``, ``f = W2 a``, ``a = silu(h)``, ``h = W1 x`` for an upstream gradient ``g``::

    g_a = g W2      g_h = c silu'(h) g_a      g_x = g_h W1      g_W2 = (c g)^T a      g_W1 = g_h^T x
    dL/dc = <g_a, a>

:func:`fused_available` says when a call can take this path; :func:`set_fused` (or the environment variable
``COUPLED_QK_FUSED=0``) turns it off everywhere, e.g. to compare with the reference
(``benchmarks/fused_ab.py`` times both in one process).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

FUSED_INTEGRATORS = ("euler", "leapfrog", "symplectic_euler")

_enabled = os.environ.get("COUPLED_QK_FUSED", "1") != "0"


def set_fused(enabled: bool) -> bool:
    """Turn the fused path on or off for the whole process; returns the previous setting."""
    global _enabled
    previous, _enabled = _enabled, bool(enabled)
    return previous


def fused_enabled() -> bool:
    """Whether the fused path is on (default on; ``COUPLED_QK_FUSED=0`` or :func:`set_fused` turn it off)."""
    return _enabled


def fused_available(q: torch.Tensor, k: torch.Tensor, w_in: torch.Tensor, dt: torch.Tensor) -> bool:
    """True when :func:`fused_step` applies: enabled, not tracing for ``torch.compile`` (Inductor fuses the
    reference itself), no autocast, one key per query head (``q.shape == k.shape``) and one floating dtype
    for ``q``, ``k``, the force weights and ``dt``."""
    if not _enabled or torch.compiler.is_compiling() or q.shape != k.shape or q.dim() != 4:
        return False
    if torch.is_autocast_enabled(q.device.type):
        return False
    return q.dtype == k.dtype == w_in.dtype == dt.dtype and q.dtype.is_floating_point


def _force(x: torch.Tensor, w_in: torch.Tensor, w_out: torch.Tensor):
    """``f(x)`` and what its backward keeps: ``((s, a), f)`` with ``s = sigmoid(W1 x)``, ``a = silu(W1 x)``."""
    h = F.linear(x, w_in)
    s = torch.sigmoid(h)
    a = h.mul_(s)
    return (s, a), F.linear(a, w_out)


def _inference_force(x: torch.Tensor, w_in: torch.Tensor, w_out: torch.Tensor):
    """``f(x)`` alone (nothing kept for a backward): ``(None, f)``."""
    return None, F.linear(F.silu(F.linear(x, w_in)), w_out)


def _force_backward(g, scale, x, sa, w_in, w_out, grads):
    """Backward of one kick ``y = scale * f(x)`` (``scale``: ``(H, 1)``, token-major layout) for the upstream
    gradient ``g`` of ``y``: adds the weight gradients to ``grads`` (a 2-list) and returns
    ``(g_x, <g, f(x)> per head)``.

    Only ``s = sigmoid(h)`` and ``a = silu(h)`` are kept from the forward: ``f`` is never needed
    (``<g, f> = <g W2, a>``), and ``silu'(h) = s + a (1 - s)`` needs no second exponential (``silu_backward``
    would compute one); it is computed in place on one temporary."""
    s, a = sa
    d, hidden = w_in.shape[1], w_in.shape[0]
    g_a = torch.matmul(g, w_out)  # gradient of <g, f> with respect to a (unscaled)
    g_scale = _head_dot(g_a, a)
    g_h = (1 - s).mul_(a).add_(s).mul_(g_a).mul_(scale)
    gw_out = (g * scale).reshape(-1, d).t().mm(a.reshape(-1, hidden))
    gw_in = g_h.reshape(-1, hidden).t().mm(x.reshape(-1, d))
    grads[0] = gw_in if grads[0] is None else grads[0].add_(gw_in)
    grads[1] = gw_out if grads[1] is None else grads[1].add_(gw_out)
    return torch.matmul(g_h, w_in), g_scale


def _euler(q, k, dtv, w_in, w_out, force=_force):
    """Forward of one Euler step: ``(q', k', tensors the backward needs)``. ``dtv`` is ``dt`` shaped to
    broadcast over the head axis: ``(H, 1)`` in the token-major layout ``(B, T, H, d_head)`` of training,
    ``(H, 1, 1)`` in the ``(B, H, T, d_head)`` layout of decoding; ``force`` is :func:`_force` (training) or
    :func:`_inference_force`."""
    sa, f = force(q, w_in, w_out)
    return torch.addcmul(q, dtv, k), torch.addcmul(k, dtv, f), sa


def _symplectic_euler(q, k, dtv, w_in, w_out, force=_force):
    sa, f = force(q, w_in, w_out)
    k2 = torch.addcmul(k, dtv, f)
    return torch.addcmul(q, dtv, k2), k2, sa


def _leapfrog(q, k, dtv, w_in, w_out, force=_force):
    half = 0.5 * dtv
    sa0, f0 = force(q, w_in, w_out)
    k_h = torch.addcmul(k, half, f0)
    q2 = torch.addcmul(q, dtv, k_h)
    sa1, f1 = force(q2, w_in, w_out)
    return q2, torch.addcmul(k_h, half, f1), (k_h, sa0, sa1)


def _head_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``sum over (B, T, d) of a * b`` per head: ``(B, T, H, d) x2 -> (H,)``."""
    return (a * b).sum((0, 1, 3))


def _token_major(x: torch.Tensor) -> torch.Tensor:
    """``(B, H, T, d)`` -> ``(B, T, H, d)`` (a view; the projections and SDPA's gradients are laid out this way)."""
    return x.transpose(1, 2)


def _upstream(g, like):
    return torch.zeros_like(like) if g is None else _token_major(g).contiguous()


class _Euler(torch.autograd.Function):
    """``q' = q + dt k``, ``k' = k + dt f(q)``."""

    @staticmethod
    def forward(ctx, q, k, dt, w_in, w_out):
        q, k = _token_major(q).contiguous(), _token_major(k)
        q2, k2, sa = _euler(q, k, dt.view(-1, 1), w_in, w_out)
        ctx.save_for_backward(q, k, dt, w_in, w_out, *sa)
        return _token_major(q2), _token_major(k2)

    @staticmethod
    def backward(ctx, g_q2, g_k2):
        q, k, dt, w_in, w_out, s, a = ctx.saved_tensors
        g_q2, g_k2 = _upstream(g_q2, q), _upstream(g_k2, q)
        dtv = dt.view(-1, 1)
        grads = [None, None]
        g_x, g_dt = _force_backward(g_k2, dtv, q, (s, a), w_in, w_out, grads)
        g_dt = g_dt + _head_dot(g_q2, k)
        g_k = torch.addcmul(g_k2, dtv, g_q2)
        return _token_major(g_x.add_(g_q2)), _token_major(g_k), g_dt, grads[0], grads[1]


class _SymplecticEuler(torch.autograd.Function):
    """``k' = k + dt f(q)``, ``q' = q + dt k'``."""

    @staticmethod
    def forward(ctx, q, k, dt, w_in, w_out):
        q, k = _token_major(q).contiguous(), _token_major(k)
        q2, k2, sa = _symplectic_euler(q, k, dt.view(-1, 1), w_in, w_out)
        ctx.save_for_backward(q, k2, dt, w_in, w_out, *sa)
        return _token_major(q2), _token_major(k2)

    @staticmethod
    def backward(ctx, g_q2, g_k2):
        q, k2, dt, w_in, w_out, s, a = ctx.saved_tensors
        g_q2, g_k2 = _upstream(g_q2, q), _upstream(g_k2, q)
        dtv = dt.view(-1, 1)
        grads = [None, None]
        g_k = torch.addcmul(g_k2, dtv, g_q2)  # total gradient of k' (= gradient of k)
        g_x, g_dt = _force_backward(g_k, dtv, q, (s, a), w_in, w_out, grads)
        g_dt = g_dt + _head_dot(g_q2, k2)
        return _token_major(g_x.add_(g_q2)), _token_major(g_k), g_dt, grads[0], grads[1]


class _Leapfrog(torch.autograd.Function):
    """``k_h = k + dt/2 f(q)``, ``q' = q + dt k_h``, ``k' = k_h + dt/2 f(q')``."""

    @staticmethod
    def forward(ctx, q, k, dt, w_in, w_out):
        q, k = _token_major(q).contiguous(), _token_major(k)
        q2, k2, (k_h, sa0, sa1) = _leapfrog(q, k, dt.view(-1, 1), w_in, w_out)
        ctx.save_for_backward(q, k_h, q2, dt, w_in, w_out, *sa0, *sa1)
        return _token_major(q2), _token_major(k2)

    @staticmethod
    def backward(ctx, g_q2, g_k2):
        q, k_h, q2, dt, w_in, w_out, s0, a0, s1, a1 = ctx.saved_tensors
        g_q2, g_k2 = _upstream(g_q2, q), _upstream(g_k2, q)
        dtv = dt.view(-1, 1)
        half = 0.5 * dtv
        grads = [None, None]
        # k' = k_h + dt/2 f(q'): into q' (through f) and k_h
        g_x, g_dt1 = _force_backward(g_k2, half, q2, (s1, a1), w_in, w_out, grads)
        g_q2 = g_x.add_(g_q2)
        # q' = q + dt k_h
        g_kh = torch.addcmul(g_k2, dtv, g_q2)
        # k_h = k + dt/2 f(q)
        g_x, g_dt0 = _force_backward(g_kh, half, q, (s0, a0), w_in, w_out, grads)
        g_dt = 0.5 * (g_dt1 + g_dt0) + _head_dot(g_q2, k_h)
        return _token_major(g_x.add_(g_q2)), _token_major(g_kh), g_dt, grads[0], grads[1]


_FUNCTIONS = {"euler": _Euler, "leapfrog": _Leapfrog, "symplectic_euler": _SymplecticEuler}
_FORWARDS = {"euler": _euler, "leapfrog": _leapfrog, "symplectic_euler": _symplectic_euler}


def fused_step(
    q: torch.Tensor, k: torch.Tensor, dt: torch.Tensor, w_in: torch.Tensor, w_out: torch.Tensor,
    integrator: str = "euler", check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of ``integrator`` with the shared MLP force, as one autograd node.

    Without gradients (``torch.no_grad()``, or no input requiring one: decoding) the same forward runs as
    plain tensor operations, without the autograd node or the contiguous copy: at one token per step the
    cost is the operations' dispatch, so fewer and simpler calls are what make it fast.

    Args:
        q, k: ``(B, H, T, d_head)`` queries and keys (one key per query head), one float dtype; any strides.
        dt: ``(H,)`` per-head step sizes (dimensionless), same dtype.
        w_in: ``(hidden, d_head)`` and w_out: ``(d_head, hidden)``: the force ``f(x) = w_out silu(w_in x)``
            (:class:`~coupled_qk.layers.forces.MLPForce` with ``n_heads=None``).
        integrator: ``"euler"``, ``"leapfrog"`` or ``"symplectic_euler"``.
        check: validate the arguments (``False`` for a caller that has, e.g. with :func:`fused_available`).

    Returns:
        ``(q', k')``, shape and dtype of ``q``; equal to
        ``integrate_qk(q, k, force, dt, integrator, n_steps=1)`` up to rounding.

    Raises:
        ValueError: an integrator outside :data:`FUSED_INTEGRATORS`, or inputs :func:`fused_available` rejects
            for shape or dtype reasons.

    Source: arXiv:2604.01683v1 (the maps); the backward is the chain rule of those maps.
    """
    if check:
        _check_step(q, k, dt, w_in, w_out, integrator)
    if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or dt.requires_grad
                                         or w_in.requires_grad or w_out.requires_grad)):
        # the maps act per token and per head: any layout works once dt broadcasts over the head axis (-3)
        return _FORWARDS[integrator](q, k, dt.view(-1, 1, 1), w_in, w_out, _inference_force)[:2]
    return _FUNCTIONS[integrator].apply(q, k, dt, w_in, w_out)


def _check_step(q, k, dt, w_in, w_out, integrator) -> None:
    if integrator not in _FUNCTIONS:
        raise ValueError(f"integrator={integrator!r} has no fused step; expected one of {FUSED_INTEGRATORS}")
    if q.shape != k.shape or q.dim() != 4 or dt.shape != (q.shape[1],):
        raise ValueError(
            f"fused_step needs q and k of one shape (B, H, T, d_head) and dt of shape (H,); got q "
            f"{tuple(q.shape)}, k {tuple(k.shape)}, dt {tuple(dt.shape)}"
        )
    if not (q.dtype == k.dtype == w_in.dtype == w_out.dtype == dt.dtype):
        raise ValueError(
            f"fused_step needs one dtype; got q {q.dtype}, k {k.dtype}, w_in {w_in.dtype}, w_out {w_out.dtype}, "
            f"dt {dt.dtype}"
        )

"""``QKDynamics``: the coupled query-key dynamics module of arXiv:2604.01683v1, ready to drop into attention.

``q2, k2 = QKDynamics(d_head, n_heads)(q, k)`` for ``q, k`` of shape ``(B, H, T, d_head)``. The module holds
the coupling network ``force`` (bias-free two-layer SiLU MLP, one per layer by default) and the learned
per-head step sizes ``dt``; the integrators live in :mod:`coupled_qk.ops.dynamics`.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from coupled_qk.ops.dynamics import check_integrator, integrate_qk

FORCES = ("mlp", "gradient")


def _check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer")
    return value


def _autocast_on(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4 has no device argument
        return torch.is_autocast_enabled()


class MLPForce(nn.Module):
    """Coupling network ``f(q) = W2 silu(W1 q)``, bias-free (arXiv:2604.01683v1).

    Maps ``(..., d_head) -> (..., d_head)``. With ``n_heads`` given, one network per head: the input must then
    have shape ``(..., n_heads, T, d_head)`` (head axis at -3).

    Args:
        d_head: input and output width.
        hidden: hidden width.
        n_heads: ``None`` for one network shared by every head, else the number of per-head networks.

    Initialisation: PyTorch's default ``nn.Linear`` init (Kaiming-uniform) for both layers.
    """

    def __init__(self, d_head: int, hidden: int, n_heads: int | None = None):
        super().__init__()
        self.d_head, self.hidden, self.n_heads = d_head, hidden, n_heads
        shape_in = (hidden, d_head) if n_heads is None else (n_heads, hidden, d_head)
        shape_out = (d_head, hidden) if n_heads is None else (n_heads, d_head, hidden)
        self.w_in = nn.Parameter(torch.empty(shape_in))
        self.w_out = nn.Parameter(torch.empty(shape_out))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Kaiming-uniform init as ``nn.Linear`` (bound ``1/sqrt(fan_in)``)."""
        nn.init.uniform_(self.w_in, -1 / math.sqrt(self.d_head), 1 / math.sqrt(self.d_head))
        nn.init.uniform_(self.w_out, -1 / math.sqrt(self.hidden), 1 / math.sqrt(self.hidden))

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        if self.n_heads is None:
            return F.linear(F.silu(F.linear(q, self.w_in)), self.w_out)
        h = F.silu(torch.einsum("...htd,hed->...hte", q, self.w_in))
        return torch.einsum("...hte,hde->...htd", h, self.w_out)


class GradientForce(nn.Module):
    """Conservative force ``f(q) = -grad V(q)`` with the scalar potential ``V(q) = w . silu(W q)``.

    Beyond the paper: makes the leapfrog integrator truly symplectic for the Hamiltonian
    ``H(q, k) = |k|^2 / 2 + V(q)`` (arXiv:2604.01683v1 uses an unconstrained MLP force). The gradient is
    computed in closed form, ``-W^T (w * silu'(W q))`` with ``silu'(x) = s(x) (1 + x (1 - s(x)))``, so it is
    differentiable and costs about as much as :class:`MLPForce`.

    Args and shapes as :class:`MLPForce`; :meth:`potential` returns ``V`` with shape ``(...)``.
    """

    def __init__(self, d_head: int, hidden: int, n_heads: int | None = None):
        super().__init__()
        self.d_head, self.hidden, self.n_heads = d_head, hidden, n_heads
        self.w_in = nn.Parameter(torch.empty((hidden, d_head) if n_heads is None else (n_heads, hidden, d_head)))
        self.w_out = nn.Parameter(torch.empty((hidden,) if n_heads is None else (n_heads, hidden)))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Uniform init with the bounds ``nn.Linear`` would use."""
        nn.init.uniform_(self.w_in, -1 / math.sqrt(self.d_head), 1 / math.sqrt(self.d_head))
        nn.init.uniform_(self.w_out, -1 / math.sqrt(self.hidden), 1 / math.sqrt(self.hidden))

    def _pre(self, q: torch.Tensor) -> torch.Tensor:
        if self.n_heads is None:
            return F.linear(q, self.w_in)
        return torch.einsum("...htd,hed->...hte", q, self.w_in)

    def _w_out(self) -> torch.Tensor:
        return self.w_out if self.n_heads is None else self.w_out.unsqueeze(-2)  # (H, 1, hidden)

    def potential(self, q: torch.Tensor) -> torch.Tensor:
        """``V(q)``, shape ``q.shape[:-1]``."""
        return (F.silu(self._pre(q)) * self._w_out()).sum(-1)

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        z = self._pre(q)
        s = torch.sigmoid(z)
        g = self._w_out() * s * (1 + z * (1 - s))  # dV/dz
        if self.n_heads is None:
            return -F.linear(g, self.w_in.t())
        return -torch.einsum("...hte,hed->...htd", g, self.w_in)


class QKDynamics(nn.Module):
    """Coupled query-key dynamics (arXiv:2604.01683v1): evolve ``(q, k)`` jointly before attention scoring.

    Args:
        d_head: head width.
        n_heads: number of heads ``H`` (one learned ``dt`` per head).
        integrator: ``"euler"`` (paper), ``"leapfrog"`` (paper's Hamiltonian integrator) or
            ``"symplectic_euler"`` (beyond the paper). See :mod:`coupled_qk.ops.dynamics`.
        n_steps: integration steps (``>= 0``; the paper finds 1 enough).
        hidden: hidden width of the coupling network (default ``d_head``, our choice; see PAPER.md).
        dt_init: initial step size for every head (finite; ``0.0`` makes the module an exact identity).
        shared_across_heads: one coupling network for all heads (default, matches the paper's +0.11%
            parameter count) or one per head.
        force: ``"mlp"`` (paper) or ``"gradient"`` (``f = -grad V``; beyond the paper).

    Attributes:
        force: the coupling network, ``(..., d_head) -> (..., d_head)`` (head axis at -3 when per head).
        dt: ``nn.Parameter`` of shape ``(n_heads,)``.

    Shapes: ``forward(q, k)`` takes ``q, k`` of shape ``(B, H, T, d_head)`` and returns two tensors of the
    same shape and dtype.

    Raises:
        ValueError: invalid constructor arguments, inputs of the wrong rank, shape, head count or dtype
            (outside autocast), or a non-finite ``dt`` (checked on CPU tensors; on accelerators the check is
            skipped to avoid a sync).
    """

    def __init__(
        self,
        d_head: int,
        n_heads: int,
        integrator: str = "euler",
        n_steps: int = 1,
        hidden: int | None = None,
        dt_init: float = 0.1,
        shared_across_heads: bool = True,
        force: str = "mlp",
    ):
        super().__init__()
        _check_positive_int("d_head", d_head)
        _check_positive_int("n_heads", n_heads)
        hidden = d_head if hidden is None else _check_positive_int("hidden", hidden)
        if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 0:
            raise ValueError(f"n_steps={n_steps!r} must be an integer >= 0")
        if not isinstance(dt_init, (int, float)) or not math.isfinite(dt_init):
            raise ValueError(f"dt_init={dt_init!r} must be a finite number")
        if force not in FORCES:
            raise ValueError(f"force={force!r} is not supported; expected one of {FORCES}")
        self.d_head, self.n_heads, self.hidden = d_head, n_heads, hidden
        self.integrator = check_integrator(integrator)
        self.n_steps = n_steps
        self.force_kind = force
        per_head = None if shared_across_heads else n_heads
        self.force = (MLPForce if force == "mlp" else GradientForce)(d_head, hidden, per_head)
        self.dt = nn.Parameter(torch.full((n_heads,), float(dt_init)))

    def extra_repr(self) -> str:
        return (
            f"d_head={self.d_head}, n_heads={self.n_heads}, hidden={self.hidden}, integrator={self.integrator}, "
            f"n_steps={self.n_steps}, force={self.force_kind}, shared={self.force.n_heads is None}"
        )

    def check_inputs(self, q: torch.Tensor, k: torch.Tensor) -> None:
        """Validate shapes and ``dt`` (see the class docstring for the errors raised)."""
        if q.dim() != 4 or k.dim() != 4:
            raise ValueError(
                f"q and k must have shape (B, H, T, d_head); got q {tuple(q.shape)} and k {tuple(k.shape)}"
            )
        if q.shape != k.shape:
            raise ValueError(f"q and k shapes differ: q {tuple(q.shape)} vs k {tuple(k.shape)}")
        if q.shape[1] != self.n_heads or q.shape[-1] != self.d_head:
            raise ValueError(
                f"expected {self.n_heads} heads of width d_head={self.d_head}; got q {tuple(q.shape)}"
            )
        if torch.compiler.is_compiling():
            return
        if q.dtype != self.dt.dtype and not _autocast_on(q.device.type):
            raise ValueError(
                f"q has dtype {q.dtype} but the module's parameters are {self.dt.dtype}; convert one with .to() "
                "or run under torch.autocast"
            )
        if self.dt.device.type == "cpu" and not torch.isfinite(self.dt).all():
            raise ValueError(f"dt must be finite; got {self.dt.detach().tolist()}")

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.check_inputs(q, k)
        return integrate_qk(q, k, self.force, self.dt, self.integrator, self.n_steps)

"""Coupling networks ("forces") of the query-key maps (docs/METHOD.md section 1).

:class:`MLPForce` is the paper's bias-free two-layer SiLU MLP; :class:`GradientForce` is the conservative
``f = -grad V`` (beyond the paper). Both map ``(..., d_head) -> (..., d_head)``, optionally one network per
head (head axis at -3), and initialise as ``nn.Linear`` would.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

FORCES = ("mlp", "gradient")
"""Names of the coupling networks accepted by ``QKDynamics(force=...)``."""


def mlp_layer(x: torch.Tensor, weight: torch.Tensor, per_head: bool) -> torch.Tensor:
    """One bias-free layer of :class:`MLPForce`: ``x (..., n_in) -> (..., n_out)`` with ``weight (n_out, n_in)``,
    or, ``per_head``, ``x (..., H, T, n_in)`` with one weight per head, ``weight (H, n_out, n_in)``."""
    if not per_head:
        return F.linear(x, weight)
    return torch.einsum("...hti,hoi->...hto", x, weight)


class MLPForce(nn.Module):
    """Coupling network ``f(q) = W2 silu(W1 q)``, bias-free (arXiv:2604.01683v1; docs/METHOD.md section 1).

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

    def pre(self, q: torch.Tensor) -> torch.Tensor:
        """The first (linear) layer: ``(..., d_head) -> (..., hidden)``, ``W1 q``."""
        return mlp_layer(q, self.w_in, self.n_heads is not None)

    def post(self, s: torch.Tensor) -> torch.Tensor:
        """The second (linear) layer: ``(..., hidden) -> (..., d_head)``, ``W2 s``."""
        return mlp_layer(s, self.w_out, self.n_heads is not None)

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        """``f(q) = W2 silu(W1 q)``: ``q (..., d_head)`` (per head: ``(..., n_heads, T, d_head)``) -> the same shape
        and dtype. No input checks (the map calling it checks, :func:`~coupled_qk.layers.qk_maps.check_qk_tensors`):
        another last dimension or dtype fails in ``F.linear`` / ``torch.einsum`` (``RuntimeError``)."""
        return self.post(F.silu(self.pre(q)))


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
        """``f(q) = -grad V(q) = -W^T (w * silu'(W q))`` in closed form: ``q (..., d_head)`` (per head:
        ``(..., n_heads, T, d_head)``) -> the same shape and dtype. No input checks, as :meth:`MLPForce.forward`."""
        z = self._pre(q)
        s = torch.sigmoid(z)
        g = self._w_out() * s * (1 + z * (1 - s))  # dV/dz
        if self.n_heads is None:
            return -F.linear(g, self.w_in.t())
        return -torch.einsum("...hte,hed->...htd", g, self.w_in)


FORCE_CLASSES = {"mlp": MLPForce, "gradient": GradientForce}

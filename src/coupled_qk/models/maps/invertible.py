"""The invertible affine query-key coupling of arXiv:2604.01683v2 (see docs/METHOD.md): the map
:class:`InvertibleQKCoupling`, its conditioner :class:`AffineCouplingNet`, its options :class:`InvertibleOptions` and
their registration (attentions ``invertible`` and ``invertible_differential``, v2's headline combination, both in
the default set). A drop-in of :mod:`coupled_qk.models.maps`: the registry calls :func:`register` at its first query.

v2 of the paper ("Invertible Query-Key Coupling Composes with Attention Mechanisms") replaces the v1
dynamics with a RealNVP-style (Dinh et al. 2017, arXiv:1605.08803) coupling of each token's query and key:
identity at initialisation, about 0.3% extra parameters, stacked on an existing attention method. Only the
abstract is public; every choice below where it is silent is ours and configurable. One *alternation* is::

    (s1, t1) = net_q(k);   q' = q * exp(S(s1)) + t1
    (s2, t2) = net_k(q');  k' = k * exp(S(s2)) + t2

with the bounded log-scale ``S(s) = scale_max * tanh(s / scale_max)`` (slope 1 at 0, ``|S| < scale_max``).
Each half-step changes one of q, k using only the other, so it is inverted in closed form
(``q = (q' - t1) * exp(-S(s1))`` with ``s1, t1`` recomputed from the unchanged ``k``), and its Jacobian is
block-triangular with diagonal ``exp(S(s))``: ``log|det J| = sum S(s1) + sum S(s2)`` per token.

Our choices where the abstract is silent (docs/METHOD.md, section 1):

- network: ``d_head -> hidden -> 2 d_head`` (log-scale and shift from one trunk), SiLU (as the v1 force),
  with biases (RealNVP's); a fresh pair of networks per alternation;
- hidden width: ``5 * d_head // 8`` (40 at d_head 64), which puts the 60m preset at 0.297% extra parameters,
  the paper's "about 0.3%";
- sharing: one set of networks per layer applied to every head (as the v1 force); per-head optional;
- alternations: 1 (q then k); more are optional;
- scale bound: ``scale_max = 1``, so one half-step rescales each coordinate by a factor in
  ``(1/e, e)`` and an attention logit by at most ``e^2`` per alternation;
- initialisation: first layer as ``nn.Linear`` (uniform, bound ``1/sqrt(d_head)``), last layer (weight and
  bias) zero, so ``S = 0, t = 0`` and the map is exactly the identity at initialisation, bit for bit;
- placement (decided by the attention layer): on the pre-RoPE projections, like the v1 dynamics; with
  grouped KV heads each query head gets its own copy of the key (k' depends on the query head's q').
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, cast, overload

import torch
import torch.nn as nn
import torch.nn.functional as F

from coupled_qk.checks.values import declared_flags, finite, positive_int
from coupled_qk.layers.qk_maps import QKMap, check_qk_tensors
from coupled_qk.models.options import HIDDEN, MapOptions, option
from coupled_qk.models.registry import register_qk_map


def default_hidden(d_head: int) -> int:
    """Default hidden width ``max(1, 5 * d_head // 8)`` of the coupling networks (our choice, see module doc)."""
    return max(1, 5 * d_head // 8)


def bounded_scale(raw: torch.Tensor, scale_max: float) -> torch.Tensor:
    """Log-scale ``scale_max * tanh(raw / scale_max)``: identity near 0, values in ``(-scale_max, scale_max)``."""
    return scale_max * torch.tanh(raw / scale_max)


class AffineCouplingNet(nn.Module):
    """Conditioner of one affine half-step: ``x (..., d_head) -> (log-scale, shift)``, each ``(..., d_head)``.

    ``W2 silu(W1 x + b1) + b2`` split in two halves (log-scale first, before the bound is applied). With
    ``n_heads`` given, one network per head and the input must have the head axis at -3, i.e. shape
    ``(..., n_heads, T, d_head)``.

    Args:
        d_head: input width (and width of each output).
        hidden: hidden width.
        n_heads: ``None`` for one network shared by every head, else the number of per-head networks.

    Initialisation: ``W1, b1`` uniform in ``+-1/sqrt(d_head)`` (``nn.Linear``'s bound), ``W2, b2`` zero.
    """

    def __init__(self, d_head: int, hidden: int, n_heads: int | None = None):
        super().__init__()
        self.d_head, self.hidden, self.n_heads = d_head, hidden, n_heads
        lead = () if n_heads is None else (n_heads,)
        self.w_in = nn.Parameter(torch.empty(*lead, hidden, d_head))
        self.b_in = nn.Parameter(torch.empty(*lead, hidden))
        self.w_out = nn.Parameter(torch.empty(*lead, 2 * d_head, hidden))
        self.b_out = nn.Parameter(torch.empty(*lead, 2 * d_head))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """First layer as ``nn.Linear``; last layer zero (the coupling is then the identity)."""
        bound = 1 / math.sqrt(self.d_head)
        nn.init.uniform_(self.w_in, -bound, bound)
        nn.init.uniform_(self.b_in, -bound, bound)
        nn.init.zeros_(self.w_out)
        nn.init.zeros_(self.b_out)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x (..., d_head)`` (per head: ``(..., n_heads, T, d_head)``) -> ``(raw log-scale, shift)``, each of
        ``x``'s shape and dtype; the bound :func:`bounded_scale` is applied by the map. Unchecked (the map checks):
        another width or dtype fails in ``F.linear`` / ``torch.einsum`` (``RuntimeError``)."""
        if self.n_heads is None:
            out = F.linear(F.silu(F.linear(x, self.w_in, self.b_in)), self.w_out, self.b_out)
        else:
            h = F.silu(torch.einsum("...htd,hed->...hte", x, self.w_in) + self.b_in.unsqueeze(-2))
            out = torch.einsum("...hte,hoe->...hto", h, self.w_out) + self.b_out.unsqueeze(-2)
        return out[..., : self.d_head], out[..., self.d_head :]


class InvertibleQKCoupling(QKMap):
    """Invertible affine coupling of each token's query and key (arXiv:2604.01683v2; docs/METHOD.md section 1).

    A :class:`~coupled_qk.layers.qk_maps.QKMap` (the interface of ``QKDynamics``): ``forward(q, k) -> (q', k')``.
    Acts on each (batch, head, position) separately, so causality and KV caching are unaffected. ``k'``
    depends on the query head's ``q'``, so ``keys_per_query_head`` is True (grouped KV heads are repeated to one
    key per query head before the map). Registered as the attentions ``invertible`` and
    ``invertible_differential`` (:func:`register`).

    Args:
        d_head: head width.
        n_heads: number of heads ``H`` of the inputs (sub-heads for Differential Attention).
        hidden: hidden width of every coupling network (default :func:`default_hidden`, ``5 d_head // 8``).
        n_alternations: number of (q-update, k-update) pairs, each with its own two networks (default 1).
        scale_max: bound on each log-scale (default 1.0; positive, finite).
        shared_across_heads: one set of networks for all heads (default) or one per head.

    Attributes:
        dt: ``None`` (the map has no step size).
        q_nets, k_nets: ``nn.ModuleList`` of :class:`AffineCouplingNet`, one per alternation; ``q_nets[i]``
            conditions on the key and updates the query, ``k_nets[i]`` the reverse.

    Shapes: ``q, k`` are ``(B, H, T, d_head)``; ``forward`` and :meth:`inverse` return two tensors of the same
    shape and dtype, :meth:`log_det` a ``(B, H, T)`` tensor (natural log, per token).

    Raises:
        ValueError: invalid constructor arguments; inputs of the wrong rank, shape or head count; inputs whose
            dtype differs from the parameters' outside autocast.
    """

    keys_per_query_head = True
    query_update_is_shift = False  # q' = q exp(S(s1(k))) + t1(k) scales q

    @declared_flags
    def __init__(
        self,
        d_head: int,
        n_heads: int,
        hidden: int | None = None,
        n_alternations: int = 1,
        scale_max: float = 1.0,
        shared_across_heads: bool = True,
    ):
        super().__init__()
        self.d_head = positive_int("d_head", d_head)
        self.n_heads = positive_int("n_heads", n_heads)
        self.hidden = default_hidden(d_head) if hidden is None else positive_int("hidden", hidden)
        self.n_alternations = positive_int("n_alternations", n_alternations)
        self.scale_max = finite("scale_max", scale_max, lo=0.0, lo_open=True)
        per_head = None if shared_across_heads else n_heads
        self.dt = None
        self.q_nets = nn.ModuleList(AffineCouplingNet(d_head, self.hidden, per_head) for _ in range(n_alternations))
        self.k_nets = nn.ModuleList(AffineCouplingNet(d_head, self.hidden, per_head) for _ in range(n_alternations))

    def extra_repr(self) -> str:
        """The settings ``repr(module)`` shows (``nn.Module.extra_repr``): widths, heads, alternations, scale bound,
        whether the networks are shared."""
        return (
            f"d_head={self.d_head}, n_heads={self.n_heads}, hidden={self.hidden}, "
            f"n_alternations={self.n_alternations}, scale_max={self.scale_max}, "
            f"shared={self.q_nets[0].n_heads is None}"
        )

    def start_at_identity(self) -> None:
        """Make the map the exact identity (log-scales and shifts zero): the last layer of every coupling network
        is zeroed, the first is kept."""
        with torch.no_grad():
            for net in (*self.q_nets, *self.k_nets):
                net.w_out.zero_()
                net.b_out.zero_()

    def check_inputs(self, q: torch.Tensor, k: torch.Tensor) -> None:
        """Validate shapes and dtypes (see the class docstring for the errors raised)."""
        check_qk_tensors(q, k, cast(AffineCouplingNet, self.q_nets[0]).w_in)  # ModuleList is untyped
        if q.dim() != 4 or k.dim() != 4:
            raise ValueError(
                f"q and k must have shape (B, H, T, d_head); got q {tuple(q.shape)} and k {tuple(k.shape)}"
            )
        if q.shape != k.shape:
            raise ValueError(f"q and k shapes differ: q {tuple(q.shape)} vs k {tuple(k.shape)}")
        if q.shape[1] != self.n_heads or q.shape[-1] != self.d_head:
            raise ValueError(f"expected {self.n_heads} heads of width d_head={self.d_head}; got q {tuple(q.shape)}")

    def _affine(self, net: nn.Module, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raw, shift = net(cond)
        return bounded_scale(raw, self.scale_max), shift

    def forward_and_log_det(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(q', k', log|det d(q', k')/d(q, k)|)``; the last has shape ``(B, H, T)`` (natural log, per token)."""
        return self._forward(q, k, with_log_det=True)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``n_alternations`` affine half-step pairs, ``q' = q exp(S(s1(k))) + t1(k)`` then
        ``k' = k exp(S(s2(q'))) + t2(q')`` (arXiv:2604.01683v2; RealNVP, Dinh et al. 2017).

        Args:
            q, k: ``(B, H, T, d_head)`` each, ``H = n_heads``, floating point of one dtype, the parameters' (any under
                autocast), on their device.

        Returns:
            ``(q', k')`` of the inputs' shape and dtype (:meth:`inverse` undoes it).

        Raises:
            TypeError, ValueError: as :meth:`check_inputs` (checked on every call): non-tensors, wrong rank,
                different shapes, head count or width, device or dtype.
        """
        return self._forward(q, k, with_log_det=False)[:2]

    @overload
    def _forward(
        self, q: torch.Tensor, k: torch.Tensor, with_log_det: Literal[True]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    @overload
    def _forward(
        self, q: torch.Tensor, k: torch.Tensor, with_log_det: Literal[False]
    ) -> tuple[torch.Tensor, torch.Tensor, None]: ...

    def _forward(
        self, q: torch.Tensor, k: torch.Tensor, with_log_det: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(q', k', log|det|)`` (see :meth:`forward_and_log_det`), the last ``None`` unless ``with_log_det``."""
        self.check_inputs(q, k)
        log_det = q.new_zeros(q.shape[:-1]) if with_log_det else None
        for net_q, net_k in zip(self.q_nets, self.k_nets):
            s1, t1 = self._affine(net_q, k)
            q = q * torch.exp(s1) + t1
            s2, t2 = self._affine(net_k, q)
            k = k * torch.exp(s2) + t2
            if log_det is not None:  # with_log_det
                log_det = log_det + s1.sum(-1) + s2.sum(-1)
        return q, k, log_det

    def inverse(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact inverse of :meth:`forward`: ``inverse(*forward(q, k)) == (q, k)`` up to rounding."""
        self.check_inputs(q, k)
        for net_q, net_k in zip(reversed(self.q_nets), reversed(self.k_nets)):
            s, t = self._affine(net_k, q)
            k = (k - t) * torch.exp(-s)
            s, t = self._affine(net_q, k)
            q = (q - t) * torch.exp(-s)
        return q, k

    def log_det(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Per-token ``log|det J|`` of :meth:`forward` at ``(q, k)``, shape ``(B, H, T)`` (natural log)."""
        return self.forward_and_log_det(q, k)[2]


@dataclass
class InvertibleOptions(MapOptions):
    """Options of :class:`InvertibleQKCoupling` (arXiv:2604.01683v2; docs/METHOD.md section 1): ``hidden``
    (conditioner width, ``None`` = ``5 d_head // 8``), ``n_alternations`` (>= 1), ``scale_max`` (bound of each
    log-scale, > 0), ``shared_across_heads``."""

    hidden: int | None = option(None, **HIDDEN)
    n_alternations: int = option(1, lo=1)
    scale_max: float = option(1.0, lo=0.0, lo_open=True)
    shared_across_heads: bool = True


def register() -> None:
    """The map ``invertible``: attentions ``invertible`` (arXiv:2604.01683v2: standard scoring with the coupling)
    and ``invertible_differential`` (v2's headline combination), both in the default set."""
    register_qk_map("invertible", "invertible", InvertibleQKCoupling, InvertibleOptions)

"""The uncoupled baseline of matched capacity (docs/METHOD.md section 2; the arXiv:2604.01683v1 "uncoupled MLP"
ablation): the map :class:`QueryMLP` (``q' = q + dt g(q)``, keys untouched), its options
:class:`QueryMLPOptions` and their registration (attentions ``uncoupled_mlp``, in the default set, and
``uncoupled_mlp_differential``, a grid cell outside it).

A drop-in of :mod:`coupled_qk.models.maps`: the registry calls :func:`register` at its first query. The update
is :func:`coupled_qk.ops.dynamics.apply_query_mlp`; ``g`` is :class:`coupled_qk.layers.forces.MLPForce`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from coupled_qk.checks.values import FLOAT32_MAX, declared_flags, finite, positive_int
from coupled_qk.layers.forces import MLPForce
from coupled_qk.layers.qk_maps import QKMap, check_qk_tensors
from coupled_qk.models.options import DT_INIT, HIDDEN, MapOptions, option
from coupled_qk.models.registry import register_qk_map
from coupled_qk.ops.dynamics import apply_query_mlp


class QueryMLP(QKMap):
    """Uncoupled baseline of matched capacity: ``q' = q + dt * g(q)``, keys untouched (docs/METHOD.md section 2).

    ``g`` is an :class:`~coupled_qk.layers.forces.MLPForce` (the same network shape as the coupled dynamics'
    force), ``dt`` one learned step per query head. The arXiv:2604.01683v1 "uncoupled MLP" ablation.

    Args:
        d_head: head width.
        n_heads: query heads ``H`` (one ``dt`` per head).
        hidden: hidden width of ``g`` (default ``d_head``).
        dt_init: initial step size (finite; ``0.0`` makes the map an exact identity).
        shared_across_heads: one ``g`` for all heads (default) or one per head.

    Attributes:
        mlp: the network ``g``; dt: ``nn.Parameter`` of shape ``(n_heads,)``.

    Shapes: ``forward(q (B, H, T, d_head), k (B, H_k, T, d_head))`` returns ``(q', k)`` (``k`` is the same
    tensor object).

    Raises:
        ValueError: a non-positive ``d_head``, ``n_heads`` or ``hidden``, or a non-finite ``dt_init``; inputs on
            another device, not floating point, or (outside autocast) of another dtype than the parameters
            (:func:`~coupled_qk.layers.qk_maps.check_qk_tensors`); ``q`` without ``n_heads`` heads.
        TypeError: ``q`` or ``k`` not a tensor.
    """

    keys_per_query_head = False
    query_update_is_shift = False  # q' = q + dt g(q) depends on q

    @declared_flags
    def __init__(
        self,
        d_head: int,
        n_heads: int,
        hidden: int | None = None,
        dt_init: float = 0.1,
        shared_across_heads: bool = True,
    ):
        super().__init__()
        positive_int("d_head", d_head)
        positive_int("n_heads", n_heads)
        hidden = d_head if hidden is None else positive_int("hidden", hidden)
        self.mlp = MLPForce(d_head, hidden, None if shared_across_heads else n_heads)
        self.dt_init = float(finite("dt_init", dt_init, -FLOAT32_MAX, FLOAT32_MAX))
        self.dt = nn.Parameter(torch.full((n_heads,), self.dt_init))

    def reset_parameters(self) -> None:
        """Set ``dt`` back to ``dt_init`` (``g`` resets itself: ``self.mlp.reset_parameters()``)."""
        nn.init.constant_(self.dt, self.dt_init)

    def start_at_identity(self) -> None:
        """Make the map the exact identity: ``dt = 0`` (and ``dt_init = 0``); ``g`` is kept."""
        self.dt_init = 0.0
        nn.init.zeros_(self.dt)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q + dt g(q), k)`` (:func:`~coupled_qk.ops.dynamics.apply_query_mlp`; the arXiv:2604.01683v1 uncoupled
        MLP ablation).

        Args:
            q: queries ``(B, H, T, d_head)``, ``H = n_heads``, floating point of the parameters' dtype (any under
                autocast), on their device.
            k: keys ``(B, H_k, T, d_head)`` of ``q``'s dtype, returned untouched (the same tensor object).

        Returns:
            ``(q', k)``, ``q'`` of ``q``'s shape and dtype.

        Raises:
            TypeError, ValueError: (``check_every_call``) as :func:`~coupled_qk.layers.qk_maps.check_qk_tensors`;
                ValueError: ``q`` not 4-D or without ``n_heads`` heads. A width other than ``d_head`` fails inside
                ``g`` (``RuntimeError``).
        """
        if self.check_every_call:
            check_qk_tensors(q, k, self.dt)
            if q.dim() != 4 or q.shape[1] != self.dt.shape[0]:
                raise ValueError(f"q must have shape (B, {self.dt.shape[0]}, T, d_head); got {tuple(q.shape)}")
        return apply_query_mlp(q, self.mlp, self.dt), k


@dataclass
class QueryMLPOptions(MapOptions):
    """Options of :class:`QueryMLP` (docs/METHOD.md section 2): ``hidden`` (width of ``g``, ``None`` =
    ``d_head``), ``dt_init`` (finite initial step) and ``shared_across_heads`` (one ``g`` for all heads)."""

    hidden: int | None = option(None, **HIDDEN)
    dt_init: float = option(0.1, **DT_INIT)
    shared_across_heads: bool = True


def register() -> None:
    """The map ``query_mlp``: attentions ``uncoupled_mlp`` (in the default set) and ``uncoupled_mlp_differential``
    (a grid cell of no paper, outside it)."""
    register_qk_map("query_mlp", "uncoupled_mlp", QueryMLP, QueryMLPOptions, in_defaults=("standard",))

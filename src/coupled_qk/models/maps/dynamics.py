"""The coupled query-key dynamics (arXiv:2604.01683v1; docs/METHOD.md sections 1 and 4): the map
:class:`QKDynamics`, its options :class:`DynamicsOptions` and their registration (attentions ``coupled`` and
``coupled_differential``; variants ``coupled`` (Euler, the paper's), ``coupled_leapfrog`` (the paper's
Hamiltonian integrator) and ``coupled_symplectic_euler``).

A drop-in of :mod:`coupled_qk.models.maps`: the registry calls :func:`register` at its first query. The
integrators are :func:`coupled_qk.ops.dynamics.integrate_qk` (float64 references in
:mod:`coupled_qk.ops.reference`); the coupling networks are :mod:`coupled_qk.layers.forces`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from coupled_qk.checks.values import FLOAT32_MAX, declared_flags, finite, nonneg_int, positive_int
from coupled_qk.layers.forces import FORCE_CLASSES, FORCES
from coupled_qk.layers.qk_maps import QKMap, check_qk_tensors
from coupled_qk.models.options import DT_INIT, HIDDEN, MapOptions, option
from coupled_qk.models.registry import register_qk_map, register_variant
from coupled_qk.ops.dynamics import INTEGRATORS, check_integrator, integrate_qk


class QKDynamics(QKMap):
    """Coupled query-key dynamics (arXiv:2604.01683v1; docs/METHOD.md section 1): evolve ``(q, k)`` jointly
    before attention scoring.

    Args:
        d_head: head width.
        n_heads: number of heads ``H`` (one learned ``dt`` per head).
        integrator: ``"euler"`` (paper), ``"leapfrog"`` (paper's Hamiltonian integrator) or
            ``"symplectic_euler"`` (beyond the paper). See :mod:`coupled_qk.ops.dynamics`.
        n_steps: integration steps (``>= 0``; the paper finds 1 enough).
        hidden: hidden width of the coupling network (default ``d_head``, our choice; docs/METHOD.md section 4).
        dt_init: initial step size for every head (finite; ``0.0`` makes the module an exact identity).
        shared_across_heads: one coupling network for all heads (default, matches the paper's +0.11%
            parameter count) or one per head.
        force: ``"mlp"`` (paper) or ``"gradient"`` (``f = -grad V``; beyond the paper).
        keys_per_query_head: ``True`` (paper, default): each query head evolves its own copy of the key, so
            under grouped-query attention the cache holds ``H`` keys. ``False`` (beyond the paper): one evolved
            key per key/value head, kicked by the force of its group's mean query, so the cache holds
            ``n_kv_heads`` keys like standard attention; the exact rule per integrator is in
            :mod:`coupled_qk.ops.dynamics` (docs/METHOD.md section 1.1). Needs ``shared_across_heads``.

    Attributes:
        force: the coupling network, ``(..., d_head) -> (..., d_head)`` (head axis at -3 when per head).
        dt: ``nn.Parameter`` of shape ``(n_heads,)``.

    Shapes: ``forward(q, k)`` takes ``q`` of shape ``(B, H, T, d_head)`` and ``k`` of the same shape
    (``keys_per_query_head=True``) or ``(B, H_kv, T, d_head)`` with ``H_kv`` dividing ``H`` (``False``), and
    returns two tensors of the shapes and dtype of the inputs.

    Raises:
        ValueError: invalid constructor arguments (also ``keys_per_query_head=False`` with a per-head force), inputs of
        the wrong rank, shape, head count or dtype
            (outside autocast), or a non-finite ``dt`` (checked on CPU tensors; on accelerators the check is
            skipped to avoid a sync).
    """

    query_update_is_shift = True  # q' = q + dt * (k or k_half): the shift depends on q only through the key
    integrates_qk = True  # forward is one integrate_qk call: decoding may fold it (layers/folded.py)

    @declared_flags
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
        keys_per_query_head: bool = True,
    ):
        super().__init__()
        positive_int("d_head", d_head)
        positive_int("n_heads", n_heads)
        hidden = d_head if hidden is None else positive_int("hidden", hidden)
        nonneg_int("n_steps", n_steps)
        finite("dt_init", dt_init, -FLOAT32_MAX, FLOAT32_MAX)  # a float32 parameter
        if force not in FORCES:
            raise ValueError(f"force={force!r} is not supported; expected one of {FORCES}")
        if not keys_per_query_head and not shared_across_heads:
            raise ValueError(
                "keys_per_query_head=False evaluates the force on the group-mean query, so it needs one network "
                "for all heads: shared_across_heads=True (got False)"
            )
        self.keys_per_query_head = bool(keys_per_query_head)
        self.d_head, self.n_heads, self.hidden = d_head, n_heads, hidden
        self.integrator = check_integrator(integrator)
        self.n_steps = n_steps
        self.force_kind = force
        per_head = None if shared_across_heads else n_heads
        self.force = FORCE_CLASSES[force](d_head, hidden, per_head)
        self.dt_init = float(dt_init)
        self.dt = nn.Parameter(torch.full((n_heads,), self.dt_init))

    def reset_parameters(self) -> None:
        """Set ``dt`` back to ``dt_init`` (the force network resets itself: ``self.force.reset_parameters()``), so
        the meta-device pattern ``to_empty()`` + every module's ``reset_parameters()`` leaves no garbage ``dt``."""
        nn.init.constant_(self.dt, self.dt_init)

    def start_at_identity(self) -> None:
        """Make the map the exact identity: ``dt = 0`` (and ``dt_init = 0``, so :meth:`reset_parameters` keeps it);
        the coupling network is kept."""
        self.dt_init = 0.0
        nn.init.zeros_(self.dt)

    def extra_repr(self) -> str:
        """The settings ``repr(module)`` shows (``nn.Module.extra_repr``): widths, heads, integrator, steps, force,
        whether the force is shared, ``keys_per_query_head``."""
        return (
            f"d_head={self.d_head}, n_heads={self.n_heads}, hidden={self.hidden}, integrator={self.integrator}, "
            f"n_steps={self.n_steps}, force={self.force_kind}, shared={self.force.n_heads is None}, "
            f"keys_per_query_head={self.keys_per_query_head}"
        )

    def check_inputs(self, q: torch.Tensor, k: torch.Tensor) -> None:
        """Validate shapes and ``dt`` (see the class docstring for the errors raised)."""
        check_qk_tensors(q, k, self.dt)
        if q.dim() != 4 or k.dim() != 4:
            raise ValueError(
                f"q and k must have shape (B, H, T, d_head); got q {tuple(q.shape)} and k {tuple(k.shape)}"
            )
        if self.keys_per_query_head or k.shape[1] == 0 or q.shape[1] % k.shape[1]:
            if q.shape != k.shape:
                raise ValueError(f"q and k shapes differ: q {tuple(q.shape)} vs k {tuple(k.shape)}")
        elif q.shape[:1] + q.shape[2:] != k.shape[:1] + k.shape[2:]:
            raise ValueError(f"q and k shapes differ beyond the head axis: q {tuple(q.shape)} vs k {tuple(k.shape)}")
        if q.shape[1] != self.n_heads or q.shape[-1] != self.d_head:
            raise ValueError(f"expected {self.n_heads} heads of width d_head={self.d_head}; got q {tuple(q.shape)}")
        if torch.compiler.is_compiling():
            return
        if self.dt.device.type == "cpu" and not torch.isfinite(self.dt).all():
            raise ValueError(f"dt must be finite; got {self.dt.detach().tolist()}")

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``n_steps`` steps of the coupled dynamics with the learned per-head ``dt``
        (:func:`~coupled_qk.ops.dynamics.integrate_qk`; arXiv:2604.01683v1, Euler and leapfrog updates).

        Args:
            q: queries ``(B, H, T, d_head)``, ``H = n_heads``, floating point of the parameters' dtype (any under
                autocast), on their device.
            k: keys of ``q``'s dtype: ``(B, H, T, d_head)``, or with ``keys_per_query_head=False``
                ``(B, H_kv, T, d_head)``, ``H_kv`` dividing ``H``.

        Returns:
            ``(q', k')``, the evolved pair, of the shapes and dtype of ``q`` and ``k``.

        Raises:
            TypeError, ValueError: (``check_every_call``) as :meth:`check_inputs`: non-tensors, wrong rank, shapes,
                head count, width, device or dtype, or (CPU) a non-finite ``dt``.
        """
        if self.check_every_call:
            self.check_inputs(q, k)
        return integrate_qk(
            q, k, self.force, self.dt, self.integrator, self.n_steps, self.head_group, check=self.check_every_call
        )


@dataclass
class DynamicsOptions(MapOptions):
    """Options of :class:`QKDynamics` (docs/METHOD.md sections 1 and 4).

    Fields: ``integrator`` (``euler``, ``leapfrog``, ``symplectic_euler``), ``n_steps`` (>= 0), ``hidden``
    (coupling-network width, ``None`` = ``d_head``), ``dt_init`` (finite initial step), ``shared_across_heads``
    (one network for all heads), ``force`` (``mlp`` or ``gradient``), ``keys_per_query_head`` (``True``, the
    paper: one evolved key per query head; ``False``, beyond the paper: one evolved key per key/value head under
    grouped-query attention, so the KV cache is as small as standard attention's; needs
    ``shared_across_heads``; docs/METHOD.md section 1.1). Set the nested field, e.g.
    ``GPTConfig(attention="coupled", n_kv_heads=2, qk_map={"keys_per_query_head": False})``.
    """

    integrator: str = option("euler", choices=INTEGRATORS)
    n_steps: int = option(1, lo=0)
    hidden: int | None = option(None, **HIDDEN)
    dt_init: float = option(0.1, **DT_INIT)
    shared_across_heads: bool = True
    force: str = option("mlp", choices=FORCES)
    keys_per_query_head: bool = True

    def validate(self) -> None:
        """The one cross-field rule of these options: ``keys_per_query_head=False`` needs
        ``shared_across_heads=True`` (the force acts on the group-mean query).

        Raises:
            ValueError: naming ``GPTConfig.qk_map.keys_per_query_head`` and ``shared_across_heads``.
        """
        if not self.keys_per_query_head and not self.shared_across_heads:
            raise ValueError(
                "GPTConfig.qk_map.keys_per_query_head=False needs shared_across_heads=True (the force acts on the "
                "group-mean query, so one network serves all heads); got shared_across_heads=False"
            )


def register() -> None:
    """The map ``dynamics`` (attentions ``coupled``, ``coupled_differential``, both in the default set) and its
    named variants: ``coupled`` spelled with the paper's Euler integrator, ``coupled_leapfrog`` (default set)
    and ``coupled_symplectic_euler`` (not in it)."""
    register_qk_map("dynamics", "coupled", QKDynamics, DynamicsOptions)
    register_variant("coupled", "coupled", integrator="euler")  # the paper's Euler integrator
    register_variant("coupled_leapfrog", "coupled", integrator="leapfrog")  # the paper's Hamiltonian one
    register_variant("coupled_symplectic_euler", "coupled", integrator="symplectic_euler", in_defaults=False)

"""Query-key maps: modules that transform the projected queries and keys before attention scoring.

The interface (docs/METHOD.md sections 1-2), implemented by every subclass of :class:`QKMap`:

- constructor ``Map(d_head, n_heads, **options)``: ``options`` are the fields of the map's nested config
  (registered with the map in :mod:`coupled_qk.models.variants`);
- ``forward(q, k) -> (q', k')`` with ``q`` of shape ``(B, H, T, d_head)`` and ``k`` of shape
  ``(B, H_k, T, d_head)``; the outputs keep shapes and dtypes. The map must act on each token independently
  (no mixing along ``T``), so causal masking and KV-cached decoding stay exact;
- class attribute ``keys_per_query_head``: ``True`` when the evolved key depends on the query head (the
  attention layer then repeats the ``n_kv_heads`` keys to ``H_k = H`` before the map and caches ``H`` keys);
  ``False`` when keys are handled per key/value head (``H_k = n_kv_heads``);
- attribute ``dt``: the learned per-head step sizes, ``nn.Parameter`` of shape ``(H,)``, or ``None`` for a
  map without one (diagnostics report it per head);
- attribute ``check_every_call`` (default ``True``): validate inputs on every call. A caller that guarantees
  shapes and dtypes (:class:`~coupled_qk.layers.attention.CausalSelfAttention` checks the map once at
  construction) sets it ``False`` so that decoding does not pay a Python check or a device sync per layer per
  token; ``head_group`` (default 1): sub-heads per head of the grouped-query layout
  (:mod:`coupled_qk.ops.heads`), set to 2 by a differential-attention layer;
- class attribute ``query_update_is_shift`` (default ``False``): ``True`` when the map moves every query by a
  shift that does not depend on that query, ``q' = q + D`` with ``D`` a function of the key (and of the query only
  through the key's own updates, as in the coupled dynamics). Then one evolved key can serve a group of query
  heads exactly: :func:`coupled_qk.hf.retrofit` with ``gqa="shared"`` runs the map on (group-mean query, key) and
  adds the mean query's shift to every query head of the group, which equals the map's query update applied to
  each query head. A map whose query update depends on the query (``q + dt g(q)``, an affine coupling
  ``q exp(s(k)) + t(k)``) would get ``q_h + D(mean q)`` instead, so ``retrofit(gqa="shared")`` refuses it when
  ``n_kv_heads < n_heads``; the registry checks at registration that the attribute is a bool;
- optional method ``start_at_identity()`` (no argument): set the parameters so that the map is exactly the
  identity, ``(q, k) -> (q, k)`` bit for bit, keeping whatever else it learned (e.g. ``dt = 0`` with the force
  network untouched). :func:`coupled_qk.hf.retrofit` calls it to insert the map into a pretrained model without
  changing its function, and refuses a map without it (or one that it does not make the identity, checked
  numerically in float64); the registry checks at registration that it takes no argument.

Maps here: :class:`QKDynamics` (the paper's coupled dynamics) and :class:`QueryMLP` (the uncoupled
matched-capacity baseline ``q' = q + dt g(q)``).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from coupled_qk._checks import FLOAT32_MAX, declared_flags, finite, nonneg_int, positive_int
from coupled_qk.layers.forces import FORCE_CLASSES, FORCES, MLPForce
from coupled_qk.layers.layer_inputs import autocast_on
from coupled_qk.ops.dynamics import apply_query_mlp, check_integrator, integrate_qk


class QKMap(nn.Module):
    """Base class of the query-key maps (the interface is described in the module docstring)."""

    keys_per_query_head: bool = True
    query_update_is_shift: bool = False
    check_every_call: bool = True
    head_group: int = 1
    # subclasses set ``self.dt`` (an ``nn.Parameter`` of shape (H,)) or ``self.dt = None`` in __init__

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # pragma: no cover
        raise NotImplementedError


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
        if self.check_every_call:
            self.check_inputs(q, k)
        return integrate_qk(
            q, k, self.force, self.dt, self.integrator, self.n_steps, self.head_group, check=self.check_every_call
        )


def check_qk_tensors(q, k, param: torch.Tensor) -> None:
    """``q`` and ``k`` are floating-point tensors of one dtype on the device of ``param`` (one of the map's
    parameters) and, outside ``torch.autocast`` (and not while compiling), of its dtype: a query-key map's first
    check, before any shape.

    Raises:
        TypeError: naming ``q`` or ``k``, for a non-tensor. ValueError: a tensor on another device, an integer or
            bool tensor, ``k`` of another dtype than ``q`` (a float64 ``k`` made float64 outputs, an int64 one
            was accepted), or ``q`` of another dtype than the parameters (float16 inputs to a float32 map failed
            inside ``F.linear`` naming nothing).
    """
    device = param.device
    for name, t in (("q", q), ("k", k)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of shape (B, H, T, d_head); got {type(t).__name__}")
        if t.device != device and device.type != "meta":
            raise ValueError(f"{name} is on {t.device} but the module is on {device}; move it there")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor; got dtype {t.dtype}")
    if k.dtype != q.dtype:
        raise ValueError(f"q and k dtypes differ: q {q.dtype} vs k {k.dtype}; give both the same dtype")
    if q.dtype != param.dtype and not torch.compiler.is_compiling() and not autocast_on(q.device.type):
        raise ValueError(
            f"q has dtype {q.dtype} but the module's parameters are {param.dtype}; convert one with "
            ".to() or run under torch.autocast"
        )


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
            (:func:`check_qk_tensors`); ``q`` without ``n_heads`` heads.
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
        if self.check_every_call:
            check_qk_tensors(q, k, self.dt)
            if q.dim() != 4 or q.shape[1] != self.dt.shape[0]:
                raise ValueError(f"q must have shape (B, {self.dt.shape[0]}, T, d_head); got {tuple(q.shape)}")
        return apply_query_mlp(q, self.mlp, self.dt), k

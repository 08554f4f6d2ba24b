"""The interface of query-key maps: modules that transform the projected queries and keys before attention
scoring (docs/METHOD.md sections 1-2). The maps themselves are drop-ins of :mod:`coupled_qk.models.maps` (the
coupled dynamics, the uncoupled query MLP, the invertible coupling) or of a plugin.

The interface, implemented by every subclass of :class:`QKMap`:

- constructor ``Map(d_head, n_heads, **options)``: ``options`` are the fields of the map's options dataclass
  (:class:`~coupled_qk.models.options.MapOptions`, registered with the map);
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
  (:mod:`coupled_qk.ops.heads`), set by the attention layer to its scoring rule's ``head_group`` (2 for
  Differential Attention);
- class attribute ``query_update_is_shift`` (default ``False``): ``True`` when the map moves every query by a
  shift that does not depend on that query, ``q' = q + D`` with ``D`` a function of the key (and of the query only
  through the key's own updates, as in the coupled dynamics). Then one evolved key can serve a group of query
  heads exactly: :func:`coupled_qk.hf.retrofit` with ``gqa="shared"`` runs the map on (group-mean query, key) and
  adds the mean query's shift to every query head of the group, which equals the map's query update applied to
  each query head. A map whose query update depends on the query (``q + dt g(q)``, an affine coupling
  ``q exp(s(k)) + t(k)``) would get ``q_h + D(mean q)`` instead, so ``retrofit(gqa="shared")`` refuses it when
  ``n_kv_heads < n_heads``; the registry checks at registration that the attribute is a bool;
- class attribute ``integrates_qk`` (default ``False``): ``True`` when ``forward`` is one call of
  :func:`coupled_qk.ops.dynamics.integrate_qk` with the map's ``force``, ``dt``, ``integrator``, ``n_steps`` and
  ``head_group`` (the coupled dynamics): decoding may then fold it into the projection
  (:mod:`coupled_qk.layers.folded`);
- optional method ``start_at_identity()`` (no argument): set the parameters so that the map is exactly the
  identity, ``(q, k) -> (q, k)`` bit for bit, keeping whatever else it learned (e.g. ``dt = 0`` with the force
  network untouched). :func:`coupled_qk.hf.retrofit` calls it to insert the map into a pretrained model without
  changing its function, and refuses a map without it (or one that it does not make the identity, checked
  numerically in float64); the registry checks at registration that it takes no argument.

:func:`check_qk_tensors` is the first input check every map runs.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from coupled_qk.layers.layer_inputs import autocast_on


class QKMap(nn.Module):
    """Base class of the query-key maps (the interface is described in the module docstring)."""

    keys_per_query_head: bool = True
    query_update_is_shift: bool = False
    integrates_qk: bool = False
    check_every_call: bool = True
    head_group: int = 1
    # subclasses set ``self.dt`` (an ``nn.Parameter`` of shape (H,)) or ``self.dt = None`` in __init__

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # pragma: no cover
        """The map: ``q (B, H, T, d_head)``, ``k (B, H_k, T, d_head)`` -> ``(q', k')`` of the same shapes and dtype,
        each token mapped independently (the interface in the module docstring); subclasses implement it and
        check their inputs first (:func:`check_qk_tensors`).

        Raises:
            NotImplementedError: always, here.
        """
        raise NotImplementedError


def check_qk_tensors(q: torch.Tensor, k: torch.Tensor, param: torch.Tensor) -> None:
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

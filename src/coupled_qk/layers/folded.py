"""Inference fast path: one step of the coupled map folded into the query-key-value projection.

Beyond the paper (an implementation of the same function). With frozen weights every *linear* part of
one step of :func:`~coupled_qk.ops.dynamics.integrate_qk` composes with the projection ``z = W x``. Write
``E``/``M`` for the grouped-query repeat and group mean (:mod:`coupled_qk.ops.heads`), ``W1``/``W2`` for the
force's two layers (:class:`~coupled_qk.layers.forces.MLPForce`) and ``s = silu(.)``. Then, per token:

- ``euler``:            ``q' = (Wq + dt E Wk) x``;  ``k' = Wk x + s(W1 M Wq x) Bk`` with ``Bk = dt_k W2``
- ``symplectic_euler``: ``[q' | k'] = [(Wq + dt E Wk) x | Wk x] + s(W1 M Wq x) [dt E Bk | Bk]``
- ``leapfrog``:         ``[q' | k_half | h2] = [A_q x | Wk x | W1 M A_q x] + s(W1 M Wq x) [C | Bh | W1 M C]``
  with ``A_q = Wq + dt E Wk``, ``Bh = dt_k W2 / 2``, ``C = dt E Bh``; then ``k' = k_half + s(h2) Bh``.

So a decoding step of Euler costs one wider projection, one SiLU and one ``addmm`` more than standard
attention (leapfrog: two of each), instead of the map's seven to twelve small kernels. The folded matrices are
built (in float64 where the device has it, then cast to the weights' dtype) by running those linear maps on
basis vectors, so they reuse the integrator's own head-layout functions rather than re-deriving them.

Used by :class:`~coupled_qk.layers.attention.CausalSelfAttention` for single-token steps with a KV cache and
gradients disabled; equal to the unfolded map up to floating-point rounding (tests compare in float64).

When a fold is stale. A fold is validated once per cache, at the cache's first single-token step (no
per-token check in the decoding loop): :func:`fold_key` (the parameters' identity, storage and
autograd version: optimizer steps, ``load_state_dict`` and ``.to()`` change it) and :func:`weight_checksum`
(sums of the weights and of their squares, in float64: writes that bypass the version counter, ``.data``
writes and fused optimizers) are compared with the layer's last fold, rebuilt when either differs. So a fold
is never stale across ``generate`` calls (each makes a new cache). Weights changed *in the middle of one
generation* are not seen by the rest of it; such a cache is stale anyway (its keys were computed with the old
weights): start a new cache after changing weights, or set ``fold_inference = False``.

Memory: a layer that has decoded keeps its last fold (``layer._fold``, not in the state dict, not pickled): a
projection 1.3-1.7x the size of ``qkv.weight`` plus the kick matrices (``(H hidden)^2`` to ``3 (H hidden)^2``).

Only the paper's setting folds: the coupled dynamics (a map declaring ``integrates_qk``,
:class:`~coupled_qk.layers.qk_maps.QKMap`; :class:`coupled_qk.models.maps.dynamics.QKDynamics`) with the MLP force,
``n_steps == 1``, the map before RoPE, plain parameters (no parametrization, inference tensor or hook on the
projection, the map or the force); anything else takes the ordinary path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from coupled_qk.layers.forces import MLPForce, mlp_layer
from coupled_qk.layers.qk_maps import QKMap
from coupled_qk.ops.heads import expand_kv, group_mean


class FoldableLayer(Protocol):
    """What the fold reads of an attention layer (:class:`~coupled_qk.layers.attention.CausalSelfAttention`, which
    imports this module): its submodules, the map, the head layout and where RoPE acts."""

    _modules: dict[str, nn.Module | None]
    qk_map: QKMap | None
    use_rope: bool
    map_position: str
    n_heads: int
    n_kv_heads: int
    d_head: int
    n_rep: int
    head_group: int

    @property
    def keys_per_query_head(self) -> bool:
        """Whether each query head evolves its own copy of the key (:attr:`CausalSelfAttention.keys_per_query_head
        <coupled_qk.layers.attention.CausalSelfAttention.keys_per_query_head>`)."""
        ...


class _FoldedMap(Protocol):
    """What the fold reads of a map that declares ``integrates_qk``: its ``forward`` is one call of
    :func:`~coupled_qk.ops.dynamics.integrate_qk` with these (the interface in :mod:`coupled_qk.layers.qk_maps`)."""

    integrator: str
    n_steps: int
    head_group: int
    keys_per_query_head: bool


@dataclass(frozen=True, eq=False)
class FoldedProjection:
    """Folded weights of one attention layer (see the module docstring).

    Fields:
        weight: ``(d_model, N)``, columns ``[q | k | h2 | h1 | v]`` (``h2`` only for leapfrog), replacing the
            layer's ``qkv.weight`` transposed: stored contiguous in this ``(in, out)`` layout, whose single-row
            product MKL streams faster than ``nn.Linear``'s ``(out, in)`` (as ``GPT.use_transposed_head``'s).
        kick: ``(H_f * hidden, width)``: right-hand side of the ``addmm`` applied to ``silu(h1)``; ``width``
            covers ``k`` (Euler), ``q | k`` (symplectic Euler) or ``q | k | h2`` (leapfrog).
        kick2: ``(H_f * hidden, H_k * d_head)``, leapfrog's closing half-kick, else ``None``.
        widths: column widths of ``(q, k, h2, h1)`` in the projection's output.
        integrator: the folded scheme.
        key: the :func:`fold_key` the fold was built from.
        checksum: the :func:`weight_checksum` it was built from.
    """

    weight: torch.Tensor
    kick: torch.Tensor
    kick2: torch.Tensor | None
    widths: tuple[int, int, int, int]
    integrator: str
    key: tuple
    checksum: tuple


def _hooked(*modules: nn.Module) -> bool:
    return any(m._forward_hooks or m._forward_pre_hooks for m in modules) or bool(
        nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks
    )


def _folded_map(layer: FoldableLayer) -> _FoldedMap:
    """``layer``'s map once :func:`_params` found it foldable: a map declaring ``integrates_qk`` has the attributes
    of :class:`_FoldedMap` (its interface), which ``nn.Module``'s attribute lookup cannot tell the type checker."""
    return cast(_FoldedMap, layer._modules["qk_map"])


def _params(layer: FoldableLayer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``(qkv.weight, dt, w_in, w_out)`` read from the module dictionaries, or None if the layer's map cannot
    be folded (module attribute lookup costs microseconds, and this runs per decoded token and layer)."""
    m = layer._modules["qk_map"]
    if (
        m is None
        or not getattr(m, "integrates_qk", False)
        or m.n_steps != 1
        or (layer.use_rope and layer.map_position == "post_rope")
    ):
        return None
    f, qkv = m._modules["force"], layer._modules["qkv"]
    if not isinstance(f, MLPForce) or qkv is None or _hooked(qkv, m, f):
        return None
    w, dt = qkv._parameters.get("weight"), m._parameters.get("dt")
    w_in, w_out = f._parameters.get("w_in"), f._parameters.get("w_out")
    if w is None or dt is None or w_in is None or w_out is None or qkv._parameters.get("bias") is not None:
        return None  # a parametrization (weight_norm ...) or a biased projection: not the layout folded here
    return w, dt, w_in, w_out


def fold_key(layer: FoldableLayer) -> tuple | None:
    """What a fold of ``layer`` (a ``CausalSelfAttention``) depends on, or ``None`` when its map cannot be folded.

    The scheme and, for the projection weight, ``dt`` and the force's weights, their identity, storage and
    autograd version (see the module docstring for the writes it does not see).
    """
    params = _params(layer)
    if params is None:
        return None
    m = _folded_map(layer)
    try:
        versions = tuple((id(p), p.data_ptr(), p._version) for p in params)
    except RuntimeError:  # inference tensors have no version counter: never fold them
        return None
    return (m.integrator, m.keys_per_query_head, m.head_group, *versions)


def weight_checksum(layer: FoldableLayer) -> tuple:
    """Sums of the folded parameters and of their squares (float64): catches writes that bypass the version
    counter. One device sync; called once per layer per cache.

    Raises:
        ValueError: the layer's map cannot be folded (see :func:`foldable`).
    """
    params = _params(layer)
    if params is None:
        raise ValueError(f"qk_map={layer.qk_map!r} cannot be folded: it has no folded parameters to checksum")
    sums = torch.stack(
        [t for p in params for t in (p.detach().sum(dtype=torch.float64), p.detach().square().sum(dtype=torch.float64))]
    )
    return () if sums.is_meta else tuple(sums.tolist())  # meta tensors (shape-only models) hold no values


def foldable(layer: FoldableLayer) -> bool:
    """Whether :func:`fold_projection` can fold ``layer``'s map (see the module docstring)."""
    return fold_key(layer) is not None


def _heads(z: torch.Tensor, n: int, width: int) -> torch.Tensor:
    """``(T, n * width) -> (1, n, T, width)``: rows as tokens in the attention layout."""
    return z.reshape(1, z.shape[0], n, width).transpose(1, 2)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``(1, n, T, width) -> (T, n * width)``: the inverse of :func:`_heads`."""
    return x.transpose(1, 2).reshape(x.shape[2], -1)


@torch.no_grad()
def fold_projection(layer: FoldableLayer) -> FoldedProjection:
    """Build the :class:`FoldedProjection` of ``layer`` from its current weights.

    Raises:
        ValueError: if the layer's map cannot be folded (see :func:`foldable`).
    """
    key, params = fold_key(layer), _params(layer)
    if key is None or params is None:
        raise ValueError(
            f"qk_map={layer.qk_map!r} cannot be folded; expected QKDynamics with the mlp force, n_steps=1, "
            "acting before RoPE, with plain parameters and no hooks"
        )
    w_qkv, dt, w_in, w_out = params
    m = _folded_map(layer)
    h, hkv, dh = layer.n_heads, layer.n_kv_heads, layer.d_head
    work = torch.float32 if w_qkv.device.type == "mps" else torch.float64  # MPS has no float64
    w = w_qkv.detach().to(work)
    z = w.t()  # projections of the basis vectors of x, one "token" each
    q = _heads(z[:, : h * dh], h, dh)
    k = _heads(z[:, h * dh : (h + hkv) * dh], hkv, dh)
    if layer.keys_per_query_head:
        k = expand_kv(k, layer.n_rep, layer.head_group)
    group, n_rep = m.head_group, h // k.shape[1]
    dt = dt.detach().to(work)
    if dt.dim() == 1:
        dt = dt.view(-1, 1, 1)
    dt_k = dt if dt.dim() == 0 else group_mean(dt, n_rep, group)  # the key's step, as in integrate_qk
    per_head, w_in, w_out = w_in.dim() == 3, w_in.detach().to(work), w_out.detach().to(work)

    def pre(x: torch.Tensor) -> torch.Tensor:  # W1 M x
        return mlp_layer(group_mean(x, n_rep, group), w_in, per_head)

    n_force, hidden = h // n_rep, w_in.shape[-2]  # heads the force acts on, its hidden width
    n_s = n_force * hidden
    s = _heads(torch.eye(n_s, dtype=work, device=w.device), n_force, hidden)  # basis of silu(h1)
    a_q = q + dt * expand_kv(k, n_rep, group)
    b_k = dt_k * mlp_layer(s, w_out, per_head)
    if m.integrator == "euler":
        blocks, kick, kick2 = [a_q, k], [b_k], None
    elif m.integrator == "symplectic_euler":
        blocks, kick, kick2 = [a_q, k], [dt * expand_kv(b_k, n_rep, group), b_k], None
    else:  # leapfrog
        b_h = 0.5 * b_k
        c = dt * expand_kv(b_h, n_rep, group)
        blocks, kick, kick2 = [a_q, k, pre(a_q)], [c, b_h, pre(c)], _rows(b_h)
    v_rows = w[(h + hkv) * dh :]
    weight = torch.cat([_rows(x).t() for x in [*blocks, pre(q)]] + [v_rows], 0)  # [q | k | (h2) | h1 | v]
    widths = (h * dh, k.shape[1] * dh, n_s if m.integrator == "leapfrog" else 0, n_s)
    dtype = w_qkv.dtype
    return FoldedProjection(
        weight=weight.t().to(dtype).contiguous(),
        kick=torch.cat([_rows(x) for x in kick], 1).to(dtype).contiguous(),
        kick2=None if kick2 is None else kick2.to(dtype).contiguous(),
        widths=widths,
        integrator=m.integrator,
        key=key,
        checksum=weight_checksum(layer),
    )


def folded_qkv(fp: FoldedProjection, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mapped ``q' | k'`` and ``v`` of one layer from its input ``x (B, T, d_model)``, as 2-D row blocks.

    One product with the folded weight, then the kicks added in place to the columns they change (per decoded token
    and layer: as few kernels and allocations as the scheme allows; a kick is cast to the product's dtype under
    ``torch.autocast``).

    Returns:
        ``qk (B*T, H*d_head + H_k*d_head)``: ``q'`` and ``k'`` side by side (so that RoPE rotates both in one
        call, as it does ``q | k`` without a map), and ``v (B*T, H_v*d_v)``; column views of one new tensor. The
        caller reshapes them to the attention layout.
    """
    z = torch.mm(x.reshape(-1, x.shape[-1]), fp.weight)
    wq, wk, wh2, wh1 = fp.widths
    end = wq + wk + wh2 + wh1
    h1 = F.silu(z[:, wq + wk + wh2 : end])
    kick = fp.kick if fp.kick.dtype == z.dtype else fp.kick.to(z.dtype)
    if fp.integrator == "euler":
        z[:, wq : wq + wk].addmm_(h1, kick)  # k' = k + s(h1) Bk
    else:  # symplectic Euler: [q' | k'] += s(h1) [..]; leapfrog: [q' | k_half | h2] += s(h1) [C | Bh | W1 M C]
        z[:, : wq + wk + wh2].addmm_(h1, kick)
    if fp.kick2 is not None:  # leapfrog: the closing half-kick, from h2
        kick2 = fp.kick2 if fp.kick2.dtype == z.dtype else fp.kick2.to(z.dtype)
        z[:, wq : wq + wk].addmm_(F.silu(z[:, wq + wk : wq + wk + wh2]), kick2)
    return z[:, : wq + wk], z[:, end:]

"""Inference fast path: one step of the coupled map folded into the query-key-value projection.

Beyond the paper (an implementation of the same function, issue 12). With frozen weights every *linear* part of
one step of :func:`~coupled_qk.ops.dynamics.integrate_qk` composes with the projection ``z = W x``. Write
``E``/``M`` for the grouped-query repeat and group mean (:mod:`coupled_qk.ops.heads`), ``W1``/``W2`` for the
force's two layers (:class:`~coupled_qk.layers.forces.MLPForce`) and ``s = silu(.)``. Then, per token:

- ``euler``:            ``q' = (Wq + dt E Wk) x``;  ``k' = Wk x + s(W1 M Wq x) Bk`` with ``Bk = dt_k W2``
- ``symplectic_euler``: ``[q' | k'] = [(Wq + dt E Wk) x | Wk x] + s(W1 M Wq x) [dt E Bk | Bk]``
- ``leapfrog``:         ``[q' | k_half | h2] = [A_q x | Wk x | W1 M A_q x] + s(W1 M Wq x) [C | Bh | W1 M C]``
  with ``A_q = Wq + dt E Wk``, ``Bh = dt_k W2 / 2``, ``C = dt E Bh``; then ``k' = k_half + s(h2) Bh``.

So a decoding step of Euler costs one wider projection, one SiLU and one ``addmm`` more than standard
attention (leapfrog: two of each), instead of the map's seven to twelve small kernels. The folded matrices are
built once per weight version (in float64, then cast to the weights' dtype) by running those linear maps on
basis vectors, so they reuse the integrator's own head-layout functions rather than re-deriving them.

Used by :class:`~coupled_qk.layers.attention.CausalSelfAttention` when decoding with a KV cache and
gradients disabled; equal to the unfolded map up to floating-point rounding (tests compare in float64).
Only the paper's setting folds: :class:`~coupled_qk.layers.qk_maps.QKDynamics` with the MLP force,
``n_steps == 1`` and the map before RoPE; anything else takes the ordinary path.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from coupled_qk.layers.forces import MLPForce
from coupled_qk.layers.qk_maps import QKDynamics
from coupled_qk.ops.heads import expand_kv, group_mean


@dataclass(frozen=True)
class FoldedProjection:
    """Folded weights of one attention layer (see the module docstring).

    Fields:
        weight: ``(N, d_model)``, rows ``[q | k | h2 | h1 | v]`` (``h2`` only for leapfrog) replacing the
            layer's ``qkv.weight``.
        kick: ``(H_f * hidden, width)``: right-hand side of the ``addmm`` applied to ``silu(h1)``; ``width``
            covers ``k`` (Euler), ``q | k`` (symplectic Euler) or ``q | k | h2`` (leapfrog).
        kick2: ``(H_f * hidden, H_k * d_head)``, leapfrog's closing half-kick, else ``None``.
        widths: column widths of ``(q, k, h2, h1)`` in the projection's output.
        integrator: the folded scheme.
        version: the :func:`fold_key` the fold was built from (it is rebuilt when the key changes).
    """

    weight: torch.Tensor
    kick: torch.Tensor
    kick2: torch.Tensor | None
    widths: tuple[int, int, int, int]
    integrator: str
    version: tuple


def fold_key(layer) -> tuple | None:
    """What a fold of ``layer`` (a ``CausalSelfAttention``) depends on, or ``None`` when its map cannot be folded.

    The key holds the scheme and, for the projection weight, ``dt`` and the force's weights, their identity,
    storage and in-place version (optimizer steps, ``load_state_dict`` and ``.to()`` all change one), so a fold
    is rebuilt whenever a weight changes. It runs once per decoded token and layer, so it reads the module
    dictionaries directly (``nn.Module`` attribute lookup costs microseconds).
    """
    m = layer._modules["qk_map"]
    if not isinstance(m, QKDynamics) or m.n_steps != 1 or (layer.use_rope and layer.map_position == "post_rope"):
        return None
    f = m._modules["force"]
    if not isinstance(f, MLPForce):
        return None
    params = (layer._modules["qkv"]._parameters["weight"], m._parameters["dt"], f._parameters["w_in"],
              f._parameters["w_out"])
    return (m.integrator, m.keys_per_query_head, m.head_group, *((id(p), p.data_ptr(), p._version) for p in params))


def foldable(layer) -> bool:
    """Whether :func:`fold_projection` can fold ``layer``'s map: :class:`~coupled_qk.layers.qk_maps.QKDynamics`
    with the MLP force, ``n_steps == 1``, acting before RoPE."""
    return fold_key(layer) is not None


def _heads(z: torch.Tensor, n: int, width: int) -> torch.Tensor:
    """``(T, n * width) -> (1, n, T, width)``: rows as tokens in the attention layout."""
    return z.reshape(1, z.shape[0], n, width).transpose(1, 2)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``(1, n, T, width) -> (T, n * width)``: the inverse of :func:`_heads`."""
    return x.transpose(1, 2).reshape(x.shape[2], -1)


@torch.no_grad()
def fold_projection(layer) -> FoldedProjection:
    """Build the :class:`FoldedProjection` of ``layer`` from its current weights.

    Raises:
        ValueError: if the layer's map cannot be folded (see :func:`foldable`).
    """
    if not foldable(layer):
        raise ValueError(
            f"qk_map={layer.qk_map!r} cannot be folded; expected QKDynamics with the mlp force, n_steps=1, "
            "acting before RoPE"
        )
    m, f = layer.qk_map, layer.qk_map.force
    h, hkv, dh = layer.n_heads, layer.n_kv_heads, layer.d_head
    w = layer.qkv.weight.to(torch.float64)
    z = w.t()  # projections of the basis vectors of x, one "token" each
    q = _heads(z[:, : h * dh], h, dh)
    k = _heads(z[:, h * dh: (h + hkv) * dh], hkv, dh)
    v_rows = w[(h + hkv) * dh:]
    group = m.head_group
    if layer.keys_per_query_head:
        k = expand_kv(k, layer.n_rep, 2 if layer.differential else 1)
    n_rep = h // k.shape[1]
    dt = m.dt.detach().to(torch.float64).view(-1, 1, 1)
    dt_k = group_mean(dt, n_rep, group)
    f = copy.deepcopy(f).to(torch.float64)  # a float64 copy (no random re-initialisation)

    def pre(x):  # W1 M x
        return f.pre(group_mean(x, n_rep, group))

    h_f = h // n_rep  # heads the force acts on
    n_s = h_f * f.hidden
    s = _heads(torch.eye(n_s, dtype=torch.float64), h_f, f.hidden)  # basis of silu(h1)
    a_q = q + dt * expand_kv(k, n_rep, group)
    b_k = dt_k * f.post(s)
    if m.integrator == "euler":
        blocks, kick, kick2 = [a_q, k], [b_k], None
    elif m.integrator == "symplectic_euler":
        blocks, kick, kick2 = [a_q, k], [dt * expand_kv(b_k, n_rep, group), b_k], None
    else:  # leapfrog
        b_h = 0.5 * b_k
        c = dt * expand_kv(b_h, n_rep, group)
        blocks, kick, kick2 = [a_q, k, pre(a_q)], [c, b_h, pre(c)], _rows(b_h)
    weight = torch.cat([_rows(x).t() for x in [*blocks, pre(q)]] + [v_rows], 0)  # [q | k | (h2) | h1 | v]
    widths = (h * dh, k.shape[1] * dh, n_s if m.integrator == "leapfrog" else 0, n_s)
    dtype = layer.qkv.weight.dtype
    return FoldedProjection(
        weight=weight.to(dtype).contiguous(),
        kick=torch.cat([_rows(x) for x in kick], 1).to(dtype).contiguous(),
        kick2=None if kick2 is None else kick2.to(dtype).contiguous(),
        widths=widths, integrator=m.integrator, version=fold_key(layer),
    )


def folded_qkv(fp: FoldedProjection, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The mapped ``(q', k')`` and ``v`` of one layer from its input ``x (B, T, d_model)``, as 2-D row blocks.

    Returns:
        ``q' (B*T, H*d_head)``, ``k' (B*T, H_k*d_head)`` and ``v (B*T, H_v*d_v)`` (column views or new tensors);
        the caller reshapes them to the attention layout.
    """
    z = F.linear(x, fp.weight).view(-1, fp.weight.shape[0])
    wq, wk, wh2, wh1 = fp.widths
    if fp.integrator == "euler":
        q, k, h1, v = z.split([wq, wk, wh1, z.shape[1] - wq - wk - wh1], 1)
        return q, torch.addmm(k, F.silu(h1), fp.kick), v
    qk, h1, v = z.split([wq + wk + wh2, wh1, z.shape[1] - wq - wk - wh2 - wh1], 1)
    u = torch.addmm(qk, F.silu(h1), fp.kick)
    if fp.integrator == "symplectic_euler":
        q, k = u.split([wq, wk], 1)
        return q, k, v
    q, k, h2 = u.split([wq, wk, wh2], 1)  # leapfrog: then the closing half-kick
    return q, torch.addmm(k, F.silu(h2), fp.kick2), v

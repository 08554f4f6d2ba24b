"""Causal self-attention with every variant of the project, selected by one string.

Variants (``ATTENTION_VARIANTS``):

- ``standard``: scaled dot-product attention (Vaswani et al. 2017).
- ``coupled``: queries and keys evolved by :class:`~coupled_qk.layers.dynamics.QKDynamics` before scoring
  (arXiv:2604.01683v1).
- ``uncoupled_mlp``: the paper's matched-capacity ablation, ``q' = q + dt * g(q)``, keys untouched.
- ``differential``: Differential Attention V1 (Ye et al. 2024, arXiv:2410.05258, microsoft/unilm
  Diff-Transformer): ``(A1 - lambda A2) V`` with half the heads, per-head RMSNorm and ``(1 - lambda_init)``.
- ``coupled_differential``: the dynamics applied to each query/key sub-head pair before both maps.

All variants use ``torch.nn.functional.scaled_dot_product_attention`` on the fast path; the eager path
(``impl="eager"``, or ``record=True``) computes the softmax explicitly and can record the attention
probabilities and the query/key states for diagnostics. Grouped-query attention: ``n_kv_heads`` divides
``n_heads``; query head ``i`` uses key/value head ``i // (n_heads // n_kv_heads)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from coupled_qk.layers.dynamics import MLPForce, QKDynamics
from coupled_qk.ops.dynamics import apply_query_mlp
from coupled_qk.ops.rope import apply_rope

ATTENTION_VARIANTS = ("standard", "coupled", "uncoupled_mlp", "differential", "coupled_differential")
COUPLED_VARIANTS = ("coupled", "coupled_differential")
DIFFERENTIAL_VARIANTS = ("differential", "coupled_differential")


def differential_lambda_init(layer_idx: int) -> float:
    """``lambda_init = 0.8 - 0.6 exp(-0.3 * layer_idx)`` for a 0-based layer index (arXiv:2410.05258, eq. 3)."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer_idx)


def expand_kv(x: torch.Tensor, n_rep: int, group: int = 1) -> torch.Tensor:
    """Repeat key/value heads for grouped-query attention.

    Args:
        x: ``(B, H_kv * group, T, d)``; heads come in consecutive groups of ``group`` sub-heads (``group=2``
            for differential attention, whose sub-heads ``2j, 2j+1`` belong to kv-head ``j``).
        n_rep: query heads per kv head.

    Returns:
        ``(B, H_kv * n_rep * group, T, d)`` where query head ``i`` (sub-heads ``group*i + s``) sees kv-head
        ``i // n_rep`` (sub-heads ``group*(i // n_rep) + s``).
    """
    if n_rep == 1:
        return x
    b, hg, t, d = x.shape
    x = x.view(b, hg // group, 1, group, t, d).expand(b, hg // group, n_rep, group, t, d)
    return x.reshape(b, hg * n_rep, t, d)


class KVCache:
    """Per-layer cache of the keys and values that attention scores against.

    Each layer stores keys *after* the dynamics and RoPE (dynamics act per token, so cached decoding is
    exact) and values, shapes ``(B, H_k, T_past, d)``. Coupled variants cache one evolved key per query
    head (the evolved key depends on the query head's state), other variants cache the ``n_kv_heads``.
    """

    def __init__(self, n_layer: int):
        self.layers: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * n_layer

    @property
    def length(self) -> int:
        """Number of cached positions (0 when empty)."""
        first = self.layers[0]
        return 0 if first is None else first[0].shape[-2]

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``k, v`` for ``layer_idx`` and return the full cached tensors."""
        past = self.layers[layer_idx]
        if past is not None:
            k, v = torch.cat([past[0], k], dim=-2), torch.cat([past[1], v], dim=-2)
        self.layers[layer_idx] = (k, v)
        return k, v


def _causal_mask(t_q: int, t_k: int, device) -> torch.Tensor:
    """Boolean ``(t_q, t_k)`` mask, True where query ``i`` (absolute position ``t_k - t_q + i``) may attend."""
    offset = t_k - t_q
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(diagonal=offset)


def attention_mask_4d(key_mask: torch.Tensor | None, t_q: int, t_k: int) -> torch.Tensor | None:
    """Boolean mask ``(B, 1, T_q, T_k)`` (True = may attend): causal, and padded keys (``key_mask`` False)
    hidden from every query except the padded position itself (so no row is empty and no NaN appears; the
    outputs at padded positions are never seen by real tokens). ``None`` when ``key_mask`` is ``None``.

    Args:
        key_mask: ``(B, T_k)`` bool, True at real tokens, or ``None``.
    """
    if key_mask is None:
        return None
    causal = _causal_mask(t_q, t_k, key_mask.device)
    own = torch.eye(t_q, t_k, dtype=torch.bool, device=key_mask.device).roll(t_k - t_q, dims=1)
    return (causal & key_mask[:, None, None, :]) | own


def scaled_dot_product(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    eager: bool,
    dropout_p: float = 0.0,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Causal attention ``softmax(q k^T / sqrt(d) + mask) v`` with the causal mask aligned to the end.

    Args:
        q: ``(B, H, T_q, d)``; k: ``(B, H, T_k, d)`` with ``T_k >= T_q`` (the last ``T_q`` keys are the
            queries' own positions); v: ``(B, H, T_k, d_v)``.
        eager: compute the softmax explicitly (at least float32) and also return the probabilities.
        mask: optional boolean ``(B, 1, T_q, T_k)`` from :func:`attention_mask_4d` (padding); replaces the
            plain causal mask.

    Returns:
        ``(out (B, H, T_q, d_v), probs (B, H, T_q, T_k) or None)``.
    """
    t_q, t_k = q.shape[-2], k.shape[-2]
    if not eager:
        if mask is not None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p), None
        if t_q == t_k:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p), None
        mask = None if t_q == 1 else _causal_mask(t_q, t_k, q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p), None
    dtype = torch.promote_types(q.dtype, torch.float32)
    scores = torch.matmul(q, k.transpose(-2, -1)).to(dtype) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~(_causal_mask(t_q, t_k, q.device) if mask is None else mask), float("-inf"))
    probs = scores.softmax(dim=-1)
    attn = F.dropout(probs, p=dropout_p) if dropout_p > 0 else probs
    return torch.matmul(attn.to(v.dtype), v), probs


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a selectable variant (see the module docstring).

    Args:
        d_model: model width.
        n_heads: query heads of the standard baseline. Differential variants use ``n_heads // 2`` heads,
            each with two query/key sub-heads of width ``d_head`` and a value of width ``2 d_head``
            (parameter-matched, as in arXiv:2410.05258).
        n_kv_heads: key/value heads (grouped-query attention); divides ``n_heads``.
        d_head: head width.
        attention: variant name from :data:`ATTENTION_VARIANTS`.
        layer_idx: 0-based layer index (sets the differential ``lambda_init``).
        dynamics: keyword arguments for :class:`QKDynamics` (integrator, n_steps, hidden, dt_init,
            shared_across_heads, force) used by the coupled variants; ``hidden`` and ``dt_init`` also size
            the uncoupled MLP.
        dynamics_position: ``"pre_rope"`` (default: dynamics on the raw projections, RoPE on the evolved
            pair) or ``"post_rope"``.
        use_rope: apply rotary embeddings (otherwise positions come from the model's embeddings).
        dropout: attention-probability dropout during training.
        impl: ``"sdpa"`` (fast) or ``"eager"``.

    Forward: ``x (B, T, d_model) -> (B, T, d_model)``; ``rope`` is ``(cos, sin)`` of shape ``(T, d_head)``
    (or ``(B, 1, T, d_head)``, per sequence) for the current positions, ``cache`` a :class:`KVCache` to read
    and extend, ``key_mask`` an optional bool ``(B, T_past + T)``, False at padding (hidden from every
    query, see :func:`attention_mask_4d`).

    Raises:
        ValueError: unknown variant or impl, head counts that do not divide, differential variants with an
            odd head count.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int,
        d_head: int,
        attention: str = "standard",
        layer_idx: int = 0,
        dynamics: dict | None = None,
        dynamics_position: str = "pre_rope",
        use_rope: bool = True,
        dropout: float = 0.0,
        impl: str = "sdpa",
    ):
        super().__init__()
        if attention not in ATTENTION_VARIANTS:
            raise ValueError(f"attention={attention!r} is unknown; expected one of {ATTENTION_VARIANTS}")
        if impl not in ("sdpa", "eager"):
            raise ValueError(f"impl={impl!r} is unknown; expected 'sdpa' or 'eager'")
        if dynamics_position not in ("pre_rope", "post_rope"):
            raise ValueError(f"dynamics_position={dynamics_position!r}; expected 'pre_rope' or 'post_rope'")
        if n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads={n_kv_heads} must divide n_heads={n_heads}")
        self.differential = attention in DIFFERENTIAL_VARIANTS
        if self.differential and (n_heads % 2 or n_kv_heads % 2):
            raise ValueError(
                f"attention={attention!r} pairs heads into sub-heads: n_heads={n_heads} and "
                f"n_kv_heads={n_kv_heads} must both be even"
            )
        self.attention, self.layer_idx, self.impl = attention, layer_idx, impl
        self.n_heads, self.n_kv_heads, self.d_head = n_heads, n_kv_heads, d_head
        self.n_rep = n_heads // n_kv_heads
        self.dynamics_position, self.use_rope, self.dropout = dynamics_position, use_rope, dropout
        self.qkv = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * d_head, bias=False)
        self.out_proj = nn.Linear(n_heads * d_head, d_model, bias=False)
        dyn = dict(dynamics or {})
        if attention in COUPLED_VARIANTS:
            self.dynamics = QKDynamics(d_head, n_heads, **dyn)
        elif attention == "uncoupled_mlp":
            hidden = dyn.get("hidden") or d_head
            shared = dyn.get("shared_across_heads", True)
            self.query_mlp = MLPForce(d_head, hidden, None if shared else n_heads)
            self.dt = nn.Parameter(torch.full((n_heads,), float(dyn.get("dt_init", 0.1))))
        if self.differential:
            self.lambda_init = differential_lambda_init(layer_idx)
            self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
                nn.Parameter(torch.randn(d_head) * 0.1) for _ in range(4)
            )
            self.subln = nn.RMSNorm(2 * d_head, eps=1e-5, elementwise_affine=True)
        self.record = False
        self.recorded: dict[str, torch.Tensor] = {}

    def differential_lambda(self) -> torch.Tensor:
        """Scalar ``lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init`` (arXiv:2410.05258, eq. 2)."""
        dtype = torch.promote_types(self.lambda_q1.dtype, torch.float32)
        l1 = torch.exp(torch.dot(self.lambda_q1.to(dtype), self.lambda_k1.to(dtype)))
        l2 = torch.exp(torch.dot(self.lambda_q2.to(dtype), self.lambda_k2.to(dtype)))
        return l1 - l2 + self.lambda_init

    def _evolve(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.attention in COUPLED_VARIANTS:
            return self.dynamics(q, k)
        if self.attention == "uncoupled_mlp":
            return apply_query_mlp(q, self.query_mlp, self.dt), k
        return q, k

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: KVCache | None = None,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        h, hkv, dh = self.n_heads, self.n_kv_heads, self.d_head
        q, k, v = self.qkv(x).split([h * dh, hkv * dh, hkv * dh], dim=-1)
        q = q.view(b, t, h, dh).transpose(1, 2)
        k = k.view(b, t, hkv, dh).transpose(1, 2)
        group = 2 if self.differential else 1
        v = v.view(b, t, hkv // group, group * dh).transpose(1, 2)
        coupled = self.attention in COUPLED_VARIANTS
        if coupled:  # each query head evolves with its own copy of the key
            k = expand_kv(k, self.n_rep, group)
        record = self.record
        if record:
            self.recorded = {"q": q.detach(), "k": k.detach()}
        if self.use_rope and self.dynamics_position == "post_rope":
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        q, k = self._evolve(q, k)
        if record:
            self.recorded.update(q_evolved=q.detach(), k_evolved=k.detach())
        if self.use_rope and self.dynamics_position == "pre_rope":
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)
        if not coupled:
            k = expand_kv(k, self.n_rep, group)
        v = expand_kv(v, self.n_rep)
        eager = record or self.impl == "eager"
        p = self.dropout if self.training else 0.0
        mask = attention_mask_4d(key_mask, t, k.shape[-2])
        if not self.differential:
            y, probs = scaled_dot_product(q, k, v, eager, p, mask)
            if record:
                self.recorded["attn"] = probs
        else:
            y1, a1 = scaled_dot_product(q[:, 0::2], k[:, 0::2], v, eager, p, mask)
            y2, a2 = scaled_dot_product(q[:, 1::2], k[:, 1::2], v, eager, p, mask)
            lam = self.differential_lambda()
            y = self.subln(y1 - lam.to(y1.dtype) * y2) * (1.0 - self.lambda_init)
            if record:
                self.recorded.update(attn=a1, attn2=a2, lambda_=lam.detach())
        return self.out_proj(y.transpose(1, 2).reshape(b, t, h * dh))

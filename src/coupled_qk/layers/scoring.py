"""Scoring rules: how attention weighs values once queries and keys are final (docs/METHOD.md section 2).

:func:`scaled_dot_product` is standard scoring (Vaswani et al. 2017), computed by the layer itself, and the
building block of the others; every other rule is a module following :class:`ScoringRule`: the built-in
Differential Attention (:class:`coupled_qk.layers.differential.DifferentialScoring`) and the rules added with
:func:`coupled_qk.models.registry.register_scoring`. Masks: :func:`attention_mask_4d` (causal plus key padding).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from coupled_qk.ops.heads import expand_kv


def _causal_mask(t_q: int, t_k: int, device: torch.device) -> torch.Tensor:
    """Boolean ``(t_q, t_k)`` mask, True where query ``i`` (absolute position ``t_k - t_q + i``) may attend."""
    offset = t_k - t_q
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(diagonal=offset)


def attention_mask_4d(key_mask: torch.Tensor | None, t_q: int, t_k: int) -> torch.Tensor | None:
    """Boolean mask ``(B, 1, T_q, T_k)`` (True = may attend): causal, with padded keys (``key_mask`` False)
    hidden from every query except the padded position itself (so no row is empty and no NaN appears; the
    outputs at padded positions are never seen by real tokens). ``None`` when ``key_mask`` is ``None``.

    Args:
        key_mask: ``(B, T_k)`` bool, True at real tokens, or ``None``.

    Raises:
        ValueError: ``key_mask`` not bool (a float additive or 0/1 integer mask: convert it with ``mask.bool()``
            or ``mask == 0`` first), not 2-D, or not of length ``T_k`` (past plus new positions).
    """
    if key_mask is None:
        return None
    if key_mask.dtype != torch.bool:
        raise ValueError(
            f"key_mask must be a bool tensor (True at real tokens, False at padding); got dtype "
            f"{key_mask.dtype} (convert a 0/1 mask with mask.bool(), an additive one with mask == 0)"
        )
    if key_mask.dim() != 2 or key_mask.shape[-1] != t_k:
        raise ValueError(
            f"key_mask must have shape (B, T_k) with T_k={t_k} (cached plus new positions); got {tuple(key_mask.shape)}"
        )
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
        q: ``(B, H, T_q, d)``; k: ``(B, H_k, T_k, d)`` with ``T_k >= T_q`` (the last ``T_q`` keys are the
            queries' own positions); v: ``(B, H_v, T_k, d_v)``. ``H_k`` and ``H_v`` divide ``H``: query head
            ``i`` uses key head ``i // (H / H_k)`` and value head ``i // (H / H_v)`` (grouped-query attention;
            with ``H_k == H_v`` read in place by SDPA's ``enable_gqa``, without repeating the cache).
        eager: compute the scores and softmax explicitly in (at least) float32 and also return the
            probabilities (float32 for half-precision inputs).
        mask: optional boolean ``(B, 1, T_q, T_k)`` from :func:`attention_mask_4d` (padding); it replaces the
            plain causal mask.

    Returns:
        ``(out (B, H, T_q, d_v), probs (B, H, T_q, T_k) or None)``.
    """
    t_q, t_k, h = q.shape[-2], k.shape[-2], q.shape[1]
    if not eager:
        if v.shape[1] != k.shape[1]:  # per-query-head keys over grouped values: one fused kernel path
            v = expand_kv(v, k.shape[1] // v.shape[1])
        # plain Python branches, never a symbolic bool: under torch.compile with dynamic shapes `t_q == t_k` is a
        # SymBool, which SDPA's is_causal and enable_gqa reject (a graph break in every cached decoding step)
        gqa = False
        if k.shape[1] != h:
            gqa = True
        causal = False
        if mask is None:
            if t_q == 1:
                pass  # one query at the end of the keys sees all of them
            elif t_q == t_k:
                causal = True
            else:
                mask = _causal_mask(t_q, t_k, q.device)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, dropout_p=dropout_p, enable_gqa=gqa
        ), None
    k, v = expand_kv(k, h // k.shape[1]), expand_kv(v, h // v.shape[1])
    # Upcast before the product: q k^T in float16 overflows for |q|, |k| ~ 33 at d = 64. The
    # product is then scaled in float32, so float32 inputs give the same bits as before.
    dtype = torch.promote_types(q.dtype, torch.float32)
    scores = torch.matmul(q.to(dtype), k.to(dtype).transpose(-2, -1)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~(_causal_mask(t_q, t_k, q.device) if mask is None else mask), float("-inf"))
    probs = scores.softmax(dim=-1)
    attn = F.dropout(probs, p=dropout_p) if dropout_p > 0 else probs
    return torch.matmul(attn.to(v.dtype), v), probs


class ScoringRule(nn.Module):
    """Interface of a scoring rule other than standard scoring: ``(q, k, v) -> attention output``.

    A subclass is built once per layer as ``cls(d_head, n_heads, layer_idx)`` and called after the query-key map
    and RoPE, on the keys and values the cache returns; its parameters are saved under the layer's ``scorer.``.

    ``forward(q, k, v, eager, dropout_p, mask)``, shapes: ``q (B, H, T_q, d_head)``, ``k (B, H_k, T_k, d_head)``
    and ``v (B, H_v, T_k, g d_head)`` with ``g = head_group``, ``T_k >= T_q`` (the last ``T_q`` keys are the
    queries' own positions) and ``H_k``, ``g H_v`` dividing ``H`` (grouped-query attention, as in
    :func:`scaled_dot_product`); ``mask`` is ``None`` (plain causal) or a bool ``(B, 1, T_q, T_k)``, True where
    a query may attend (:func:`attention_mask_4d`). Returns ``(y (B, H / g, T_q, g d_head), probs)``: ``probs``
    is what the diagnostics read when ``eager`` is True (``None`` allowed otherwise): the probabilities
    ``(B, H, T_q, T_k)``, or a dict of :class:`~coupled_qk.layers.attention.AttentionRecord` fields (``attn``
    required; e.g. Differential Attention's ``attn``, ``attn2`` and ``lam``). :func:`scaled_dot_product` is the
    building block most rules need. A rule with parameters may define ``reset_parameters()`` (called by the
    Hugging Face classes to initialise fresh weights).

    Attributes:
        head_group: query/key sub-heads per head (``g``): 1 for added rules (the registry refuses others); the
            built-in Differential Attention pairs sub-heads (2).
        own_random_stream: ``True`` (default): the rule's parameters are drawn from a random stream of their own
            (:func:`coupled_qk.layers.attention.build_with_own_rng`), so every weight it does not own is drawn
            as without it (paired by seed). ``False``: from the model's stream, in construction order (the
            built-in Differential Attention, whose lambdas were always drawn so: the initial weights of a seed
            stay what they were).
        inline_parameter_order: ``False`` (default): the layer lists the rule's parameters after its own
            submodules', as any submodule's. ``True``: in the order of a layer whose code the rule was, its own
            parameters first and its submodules' after the layer's others (the built-in Differential Attention:
            an optimizer state or a gradient norm keeps the order it always had).
    """

    head_group: int = 1
    own_random_stream: bool = True
    inline_parameter_order: bool = False

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        eager: bool,
        dropout_p: float = 0.0,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | dict[str, torch.Tensor | None] | None]:
        """Attention output and (when ``eager``) probabilities or record fields; see the class docstring."""
        raise NotImplementedError


ScoringFactory = Callable[[int, int, int], ScoringRule]
"""``(d_head, n_heads, layer_idx) -> scoring rule module`` (a :class:`ScoringRule` subclass is one)."""

"""Differential Attention V1 (Ye et al. 2024, arXiv:2410.05258; microsoft/unilm Diff-Transformer) as a scoring
rule: ``(A1 - lambda A2) V`` with half the heads, per-head RMSNorm and ``(1 - lambda_init)`` (docs/METHOD.md
section 2).

:class:`DifferentialScoring` is a :class:`~coupled_qk.layers.scoring.ScoringRule` like any added rule; it pairs
query/key sub-heads (``head_group = 2``): head ``i`` of the layer is sub-heads ``2i`` (feeding ``A1``) and
``2i + 1`` (feeding ``A2``) with one value of width ``2 d_head`` (parameter-matched with standard attention).
The registry (:mod:`coupled_qk.models.registry`) names it ``differential``; the attention layer builds it from that
name too. :func:`differential_lambda_init` and :func:`differential_split_values` are its two formulas.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from coupled_qk.layers.scoring import ScoringRule, scaled_dot_product


def differential_lambda_init(layer_idx: int) -> float:
    """``lambda_init = 0.8 - 0.6 exp(-0.3 * layer_idx)`` for a 0-based layer index (arXiv:2410.05258, eq. 3)."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer_idx)


def differential_split_values(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The two attention outputs ``A1 V`` and ``A2 V`` of differential scoring in one SDPA call whose query,
    key and value heads all have width ``d``, so that on CUDA the flash kernel is eligible (it needs equal
    widths; ``V`` of width ``2 d`` falls to a slower kernel).

    ``V`` is split into its halves ``Va, Vb`` (width ``d`` each) and the four products ``A1 Va, A1 Vb, A2 Va,
    A2 Vb`` are stacked along the batch dimension (``4 B``); ``A1 V = [A1 Va, A1 Vb]`` (concatenated on the
    last dimension). This is the layout of the reference implementation (microsoft/unilm Diff-Transformer,
    ``multihead_flashdiff_2``: two flash calls per map, one per value half). The scores are computed twice,
    the value products once: the same function as :func:`scaled_dot_product` on the full-width ``V`` up to
    rounding.

    Args:
        q: ``(B, H, T_q, d)`` with sub-heads interleaved (``q[:, 0::2]`` feeds ``A1``, ``q[:, 1::2]`` ``A2``);
            k: ``(B, H_k, T_k, d)`` likewise; v: ``(B, H_v, T_k, 2 d)``, ``H_v`` dividing ``H / 2``.
        dropout_p: attention dropout; mask: optional bool ``(B, 1, T_q, T_k)`` (:func:`attention_mask_4d`).

    Returns:
        ``(y1, y2)``, each ``(B, H / 2, T_q, 2 d)``.
    """
    b, d = q.shape[0], q.shape[-1]
    va, vb = v[..., :d], v[..., d:]
    q1, q2, k1, k2 = q[:, 0::2], q[:, 1::2], k[:, 0::2], k[:, 1::2]
    qs = torch.cat([q1, q1, q2, q2])
    ks = torch.cat([k1, k1, k2, k2])
    vs = torch.cat([va, vb, va, vb])
    ms = None if mask is None else mask.expand(b, *mask.shape[1:]).repeat(4, 1, 1, 1)
    out, _ = scaled_dot_product(qs, ks, vs, False, dropout_p, ms)
    o = out.unflatten(0, (4, b))
    return torch.cat([o[0], o[1]], dim=-1), torch.cat([o[2], o[3]], dim=-1)


class DifferentialScoring(ScoringRule):
    """Differential Attention V1 (arXiv:2410.05258, eqs. 1-3): ``y = (1 - lambda_init) RMSNorm(A1 V - lambda A2 V)``
    per head, with ``lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init``.

    Args:
        d_head: sub-head width ``d`` (the value of a head has width ``2 d``).
        n_heads: query sub-heads ``H`` of the layer (``H / 2`` differential heads); unused beyond the interface.
        layer_idx: 0-based layer index (sets ``lambda_init``, :func:`differential_lambda_init`).

    Attributes:
        lambda_q1, lambda_k1, lambda_q2, lambda_k2: ``nn.Parameter`` ``(d_head,)``, ``N(0, 0.1)``, drawn from the
            model's random stream at construction (``own_random_stream = False``); the layer lists them first
            and ``subln`` last among its parameters (``inline_parameter_order = True``), the order of the layer
            that held them before this rule was a module, so optimizer states and gradient norms keep theirs.
        subln: the per-head ``nn.RMSNorm(2 d_head)`` (eps 1e-5); it runs in its weight's dtype (float32 under
            autocast) and returns the input dtype.
        lambda_init: ``float``.
        split_values: ``None`` (default: on CUDA only), ``True`` or ``False``: compute ``A1 V`` and ``A2 V`` in one
            SDPA call with the value split into halves of width ``d_head`` (:func:`differential_split_values`),
            so every head width is equal and CUDA's flash kernel is eligible; the same function up to rounding.

    Shapes (:class:`~coupled_qk.layers.scoring.ScoringRule`): ``q (B, H, T_q, d)``, ``k (B, H_k, T_k, d)``,
    ``v (B, H_v, T_k, 2 d)`` -> ``y (B, H / 2, T_q, 2 d)``; when ``eager``, the record fields ``attn`` (``A1``),
    ``attn2`` (``A2``), each ``(B, H / 2, T_q, T_k)`` float32 (or float64), and ``lam`` (the scalar ``lambda``).
    """

    head_group = 2
    own_random_stream = False  # the lambdas come from the model's stream, as they always did (paired seeds)
    inline_parameter_order = True  # listed as when they were the layer's: lambdas first, the norm last

    def __init__(self, d_head: int, n_heads: int, layer_idx: int):
        super().__init__()
        self.lambda_init = differential_lambda_init(layer_idx)
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.randn(d_head) * 0.1) for _ in range(4)
        )
        self.subln = nn.RMSNorm(2 * d_head, eps=1e-5, elementwise_affine=True)
        self.split_values: bool | None = None

    def reset_parameters(self) -> None:
        """Re-draw the lambdas, ``N(0, 0.1)`` as at construction (the norm resets itself)."""
        for p in (self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2):
            nn.init.normal_(p, 0.0, 0.1)

    def differential_lambda(self) -> torch.Tensor:
        """Scalar ``lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init`` (arXiv:2410.05258, eq. 2), in (at
        least) float32."""
        dtype = torch.promote_types(self.lambda_q1.dtype, torch.float32)
        l1 = torch.exp(torch.dot(self.lambda_q1.to(dtype), self.lambda_k1.to(dtype)))
        l2 = torch.exp(torch.dot(self.lambda_q2.to(dtype), self.lambda_k2.to(dtype)))
        return l1 - l2 + self.lambda_init

    def uses_split_values(self, q: torch.Tensor) -> bool:
        """Whether :meth:`forward` uses :func:`differential_split_values` for ``q`` (``split_values``: ``None`` =
        on CUDA only, where equal head widths let SDPA pick the flash kernel; ``True``/``False`` force it)."""
        return q.device.type == "cuda" if self.split_values is None else bool(self.split_values)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        eager: bool,
        dropout_p: float = 0.0,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor | None] | None]:
        """``(y, record fields or None)``; see the class docstring."""
        a1 = a2 = None
        if not eager and self.uses_split_values(q):
            y1, y2 = differential_split_values(q, k, v, dropout_p, mask)
        else:
            y1, a1 = scaled_dot_product(q[:, 0::2], k[:, 0::2], v, eager, dropout_p, mask)
            y2, a2 = scaled_dot_product(q[:, 1::2], k[:, 1::2], v, eager, dropout_p, mask)
        lam = self.differential_lambda()
        z = y1 - lam.to(y1.dtype) * y2
        # the norm runs in its weight's precision (fp32 under autocast: no bf16-input/fp32-weight mismatch,
        # which also disables the fused kernel); fp32 and fp64 models see no cast at all
        norm_dtype = torch.promote_types(z.dtype, self.subln.weight.dtype)
        y = (self.subln(z.to(norm_dtype)) * (1.0 - self.lambda_init)).to(z.dtype)
        return y, (dict(attn=a1, attn2=a2, lam=lam.detach()) if eager else None)

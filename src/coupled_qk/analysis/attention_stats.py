"""Pure-math attention diagnostics (docs/METHOD.md section 7).

Every function here takes tensors with arbitrary leading (batch, head, ...) dimensions, works on the
trailing two axes, computes in ``float64`` internally (any real floating or integer input dtype is
accepted, including ``bfloat16`` and ``float16``) and returns ``float64`` tensors on the input's device.
Inputs are detached: the diagnostics never build an autograd graph.

Shapes used below: an attention map ``A`` is ``(..., T, T)`` with row ``i`` the distribution of query ``i``
over keys (for a causal map, zeros above the diagonal); a layer output / hidden state ``X`` is
``(..., T, d)``. Results are ``(...)`` unless stated otherwise.

Conventions (all configurable where it matters):

* Entropies are in nats with ``0 log 0 = 0``.
* Normalised entropy of a causal map divides row ``i`` (0-based; ``i + 1`` allowed keys) by ``log(i + 1)``;
  row 0 has ``log 1 = 0`` and is excluded from the average, so ``T >= 2`` is required.
* Attention-sink mass excludes row 0 by default (row 0 of a causal map trivially puts mass 1 on key 0).
* Singular values smaller than or equal to ``rtol * sigma1`` (default ``rtol = k * eps_float64``, with ``k``
  the number of singular values, as in ``numpy.linalg.matrix_rank``) are treated as exactly zero in the
  effective rank and the spectral gap. If ``sigma2`` is zero (or absent, ``T = 1``) the gap ratio is
  ``inf`` and the relative gap is ``1.0``; for the zero matrix both are ``nan`` and the effective rank is 0.
* Rank collapse is the relative Frobenius distance from the nearest ``1 x^T`` (Dong et al. 2021 use a
  composite l1/l_inf norm; that variant is available with ``norm="l1inf"``).
* Differential attention's signed map ``A1 - lambda * A2`` is not a probability matrix: only its spectrum,
  effective rank and spectral gap are reported; entropies and sink mass are reported on ``A1`` and ``A2``.

The functions live in :mod:`~coupled_qk.analysis.entropy`, :mod:`~coupled_qk.analysis.spectral` and
:mod:`~coupled_qk.analysis.residuals`; this module re-exports them and holds the per-map summaries.
"""

from __future__ import annotations

import math

import torch

from coupled_qk.analysis.entropy import (
    attention_entropy,
    normalized_attention_entropy,
    normalized_entropy_f64,
    row_entropy,
    row_entropy_f64,
    sink_mass,
    sink_mass_f64,
)
from coupled_qk.analysis.float64 import F64, map_f64
from coupled_qk.analysis.residuals import rank_collapse_residual, relative_update
from coupled_qk.analysis.spectral import (
    effective_rank,
    effective_rank_from_singular_values,
    singular_values,
    spectral_gap,
    spectral_gap_from_singular_values,
)
from coupled_qk.checks.tensors import check_causal, check_stochastic, resolve_atol, to_f64

__all__ = [
    "row_entropy",
    "attention_entropy",
    "normalized_attention_entropy",
    "singular_values",
    "effective_rank_from_singular_values",
    "effective_rank",
    "spectral_gap_from_singular_values",
    "spectral_gap",
    "sink_mass",
    "rank_collapse_residual",
    "relative_update",
    "summarize_attention",
    "summarize_differential_attention",
]


# ----------------------------------------------------------------------------------------------------------
# summaries
# ----------------------------------------------------------------------------------------------------------


def _spectral_summary(s: torch.Tensor, rtol: float | None) -> dict[str, torch.Tensor]:
    ratio, relative = spectral_gap_from_singular_values(s, rtol=rtol)
    return {
        "singular_values": s,
        "effective_rank": effective_rank_from_singular_values(s, rtol=rtol),
        "spectral_gap_ratio": ratio,
        "spectral_gap_relative": relative,
    }


def _summarize_f64(
    A64: torch.Tensor, name: str, tol: float, causal: bool, include_first_row: bool, rtol: float | None
) -> dict[str, torch.Tensor]:
    T = A64.shape[-1]
    if T < 2:
        raise ValueError(
            f"summarize needs T >= 2 (normalized entropy and sink mass exclude row 0); got {name} of shape "
            f"{tuple(A64.shape)}"
        )
    check_stochastic(A64, name, tol)
    if causal:
        check_causal(A64, name, tol)
    H = row_entropy_f64(A64)
    out = {
        "entropy": H.mean(dim=-1),
        "normalized_entropy": normalized_entropy_f64(H, causal),
        "sink_mass": sink_mass_f64(A64, include_first_row),
    }
    out.update(_spectral_summary(torch.linalg.svdvals(A64), rtol))
    return out


def summarize_attention(
    A: torch.Tensor,
    *,
    causal: bool = True,
    include_first_row: bool = False,
    atol: float | None = None,
    rtol: float | None = None,
) -> dict[str, torch.Tensor]:
    """All map diagnostics of docs/METHOD.md section 7 at once (one batched SVD).

    Source: docs/METHOD.md section 7; effective rank from Roy & Vetterli 2007. Keys (all ``float64``):

    * ``"entropy"`` ``(...)``: :func:`attention_entropy`, nats.
    * ``"normalized_entropy"`` ``(...)``: :func:`normalized_attention_entropy` (row 0 excluded if causal).
    * ``"sink_mass"`` ``(...)``: :func:`sink_mass` (row 0 excluded unless ``include_first_row``).
    * ``"singular_values"`` ``(..., T)``: descending.
    * ``"effective_rank"`` ``(...)``: :func:`effective_rank`.
    * ``"spectral_gap_ratio"``, ``"spectral_gap_relative"`` ``(...)``: :func:`spectral_gap`.

    Args:
        A: attention map ``(..., T, T)``, ``T >= 2``, any real dtype; rows are probability vectors
            (causal, i.e. zero above the diagonal, if ``causal``).
        causal: whether ``A`` is causal (affects the normalised entropy and adds a causality check).
        include_first_row: include row 0 in the sink mass.
        atol: tolerance for the row-sum / non-negativity / causality checks (default ``1e-4``, ``1e-2`` for
            16-bit floats).
        rtol: relative singular-value threshold (default ``T * eps_float64``).

    Returns:
        ``dict[str, Tensor]`` as above.

    Raises:
        TypeError: ``A`` is not a real tensor.
        ValueError: ``A`` is not ``(..., T, T)`` with ``T >= 2``, is non-finite, is not row-stochastic
            within ``atol``, or (``causal=True``) has mass above the diagonal.
    """
    A64 = map_f64(A, "A")
    return _summarize_f64(A64, "A", resolve_atol(atol, A.dtype), causal, include_first_row, rtol)


def summarize_differential_attention(
    A1: torch.Tensor,
    A2: torch.Tensor,
    lam: float | torch.Tensor,
    *,
    causal: bool = True,
    include_first_row: bool = False,
    atol: float | None = None,
    rtol: float | None = None,
) -> dict[str, torch.Tensor]:
    """Diagnostics for Differential Attention's two maps and its signed map ``A1 - lam * A2``.

    Source: Ye et al. 2024, "Differential Transformer" (arXiv:2410.05258); docs/METHOD.md sections 2 and 7.

    Convention for the signed map: it is not a probability matrix (rows sum to ``1 - lam`` and entries
    may be negative), so entropy, normalised entropy and sink mass are **undefined for it and reported
    only for ``A1`` and ``A2``**. For the signed map we report the singular values (which are non-negative
    by definition, i.e. magnitudes), the effective rank computed from them and the spectral gap.

    Keys: ``"a1/<key>"`` and ``"a2/<key>"`` for every key of :func:`summarize_attention`, plus
    ``"signed/singular_values"`` ``(..., T)``, ``"signed/effective_rank"``, ``"signed/spectral_gap_ratio"``
    and ``"signed/spectral_gap_relative"`` ``(...)``. All ``float64``.

    Args:
        A1, A2: the two softmax maps ``(..., T, T)``, same shape, ``T >= 2``, any real dtype.
        lam: ``lambda``, a Python number or a real tensor broadcastable to the leading shape ``A1.shape[:-2]``
            (e.g. one value per layer, or per batch and head).
        causal, include_first_row, atol, rtol: as in :func:`summarize_attention`.

    Returns:
        ``dict[str, Tensor]`` as above.

    Raises:
        TypeError: an input is not a real tensor / number.
        ValueError: as :func:`summarize_attention` for ``A1`` or ``A2``; shapes of ``A1`` and ``A2`` differ;
            ``lam`` is non-finite or not broadcastable to ``A1.shape[:-2]``.
    """
    A1_64 = map_f64(A1, "A1")
    A2_64 = map_f64(A2, "A2")
    if A1.shape != A2.shape:
        raise ValueError(
            f"A1 and A2 must have the same shape (..., T, T); got A1 {tuple(A1.shape)} and A2 {tuple(A2.shape)}"
        )
    if isinstance(lam, torch.Tensor):
        lam64 = to_f64(lam, "lam")
    elif isinstance(lam, (int, float)) and not isinstance(lam, bool):
        if not math.isfinite(lam):
            raise ValueError(f"lam must be finite; got {lam}")
        lam64 = torch.tensor(float(lam), dtype=F64, device=A1_64.device)
    else:
        raise TypeError(f"lam must be a number or a torch.Tensor; got {type(lam).__name__}")
    lead = A1.shape[:-2]
    try:
        if torch.broadcast_shapes(lam64.shape, lead) != lead:
            raise RuntimeError
    except RuntimeError:
        raise ValueError(
            f"lam must be a scalar or broadcastable to the leading shape {tuple(lead)} of A1; "
            f"got lam of shape {tuple(lam64.shape)}"
        ) from None
    out: dict[str, torch.Tensor] = {}
    for name, A64, orig in (("a1", A1_64, A1), ("a2", A2_64, A2)):
        tol = resolve_atol(atol, orig.dtype)
        for key, val in _summarize_f64(A64, name.upper(), tol, causal, include_first_row, rtol).items():
            out[f"{name}/{key}"] = val
    signed = A1_64 - lam64.to(A1_64.device)[..., None, None] * A2_64
    for key, val in _spectral_summary(torch.linalg.svdvals(signed), rtol).items():
        out[f"signed/{key}"] = val
    return out

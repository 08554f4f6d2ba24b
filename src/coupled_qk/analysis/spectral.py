"""Singular values, effective rank (Roy & Vetterli 2007) and spectral gap of attention maps.

Conventions: :mod:`coupled_qk.analysis.attention_stats` (docs/METHOD.md section 7)."""

from __future__ import annotations

import math

import torch

from coupled_qk.analysis.float64 import EPS64, map_f64, safe_div
from coupled_qk.checks.tensors import to_f64

# ----------------------------------------------------------------------------------------------------------
# spectrum
# ----------------------------------------------------------------------------------------------------------


def _default_rtol(s: torch.Tensor, rtol: float | None) -> float:
    if rtol is None:
        return s.shape[-1] * EPS64
    if not rtol >= 0:
        raise ValueError(f"rtol must be >= 0; got {rtol}")
    return float(rtol)


def _zero_tiny(s: torch.Tensor, rtol: float) -> torch.Tensor:
    return torch.where(s > rtol * s.amax(dim=-1, keepdim=True), s, torch.zeros_like(s))


def _check_sv(s: torch.Tensor, name: str = "s") -> torch.Tensor:
    if not isinstance(s, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(s).__name__}")
    if s.dim() < 1 or s.shape[-1] < 1:
        raise ValueError(f"{name} must have shape (..., k) with k >= 1; got shape {tuple(s.shape)}")
    s64 = to_f64(s, name)
    if s64.numel() and float(s64.min()) < 0:
        raise ValueError(f"{name} must be non-negative singular values; got min {float(s64.min()):.3g}")
    return s64


def singular_values(A: torch.Tensor) -> torch.Tensor:
    """Singular values of each map, sorted descending (batched ``torch.linalg.svdvals`` in float64).

    Source: docs/METHOD.md section 7 (singular-value spectrum). No row-sum requirement.

    Args:
        A: map ``(..., T, T)``, any real dtype.

    Returns:
        ``float64`` tensor ``(..., T)``, non-negative, descending along the last axis.

    Raises:
        TypeError: ``A`` is not a real tensor.
        ValueError: ``A`` is not ``(..., T, T)`` or has non-finite entries.
    """
    return torch.linalg.svdvals(map_f64(A, "A"))


def effective_rank_from_singular_values(s: torch.Tensor, *, rtol: float | None = None) -> torch.Tensor:
    """Effective rank ``exp(H(p))``, ``p = sigma / sum(sigma)``, from precomputed singular values.

    Source: Roy & Vetterli 2007, "The effective rank: a measure of effective dimensionality" (EUSIPCO);
    docs/METHOD.md section 7. ``H`` is the Shannon entropy in nats with ``0 log 0 = 0``; the result lies in
    ``[1, k]`` for a non-zero matrix. Values ``<= rtol * sigma1`` are treated as 0 (default
    ``rtol = k * eps_float64``), so an exactly rank-r matrix with equal singular values gives r. The zero
    matrix gives 0 (a convention: the formula is undefined there).

    Args:
        s: singular values ``(..., k)``, non-negative, any order.
        rtol: relative threshold below which singular values count as zero.

    Returns:
        ``float64`` tensor ``(...)``.

    Raises:
        TypeError: ``s`` is not a real tensor.
        ValueError: ``s`` is 0-D, empty in its last axis, negative or non-finite; ``rtol < 0``.
    """
    s64 = _check_sv(s)
    s64 = _zero_tiny(s64, _default_rtol(s64, rtol))
    total = s64.sum(dim=-1, keepdim=True)
    p = safe_div(s64, total)
    erank = torch.exp(-torch.special.xlogy(p, p).sum(dim=-1))
    return torch.where(total.squeeze(-1) > 0, erank, torch.zeros_like(erank))


def effective_rank(A: torch.Tensor, *, rtol: float | None = None) -> torch.Tensor:
    """Effective rank of each map (Roy & Vetterli 2007): ``exp`` of the entropy of normalised singular values.

    Source: Roy & Vetterli 2007; docs/METHOD.md section 7. See :func:`effective_rank_from_singular_values` for
    the thresholding and zero-matrix conventions. No row-sum requirement.

    Args:
        A: map ``(..., T, T)``, any real dtype.
        rtol: relative threshold below which singular values count as zero (default ``T * eps_float64``).

    Returns:
        ``float64`` tensor ``(...)`` in ``[1, T]`` (0 for the zero matrix).

    Raises:
        TypeError, ValueError: as :func:`singular_values`; ``rtol < 0``.
    """
    return effective_rank_from_singular_values(singular_values(A), rtol=rtol)


def spectral_gap_from_singular_values(
    s: torch.Tensor, *, rtol: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Spectral gap ``(sigma1 / sigma2, (sigma1 - sigma2) / sigma1)`` from precomputed singular values.

    Source: docs/METHOD.md section 7. ``sigma2 <= rtol * sigma1`` (default ``rtol = k * eps_float64``) counts as
    zero, and a missing ``sigma2`` (``k = 1``) is zero: then the ratio is ``inf`` and the relative gap
    exactly ``1.0``. If ``sigma1 = 0`` (zero matrix) both are ``nan``.

    Args:
        s: singular values ``(..., k)``, non-negative, any order (sorted internally).
        rtol: relative threshold below which ``sigma2`` counts as zero.

    Returns:
        ``(ratio, relative)``, each ``float64`` ``(...)``; ``ratio >= 1``, ``relative`` in ``[0, 1]``.

    Raises:
        TypeError: ``s`` is not a real tensor.
        ValueError: ``s`` is 0-D, empty in its last axis, negative or non-finite; ``rtol < 0``.
    """
    s64 = _check_sv(s)
    s64 = _zero_tiny(s64, _default_rtol(s64, rtol)).sort(dim=-1, descending=True).values
    s1 = s64[..., 0]
    s2 = s64[..., 1] if s64.shape[-1] > 1 else torch.zeros_like(s1)
    nan = torch.full_like(s1, float("nan"))
    ratio = torch.where(s2 > 0, safe_div(s1, s2), torch.full_like(s1, math.inf))
    ratio = torch.where(s1 > 0, ratio, nan)
    relative = torch.where(s1 > 0, safe_div(s1 - s2, s1), nan)
    return ratio, relative


def spectral_gap(A: torch.Tensor, *, rtol: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Spectral gap of each map: ``(sigma1 / sigma2, (sigma1 - sigma2) / sigma1)``.

    Source: docs/METHOD.md section 7. Conventions for ``sigma2 = 0`` (``inf`` and ``1.0``) and the zero matrix
    (``nan``) as in :func:`spectral_gap_from_singular_values`. No row-sum requirement.

    Args:
        A: map ``(..., T, T)``, any real dtype.
        rtol: relative threshold below which ``sigma2`` counts as zero (default ``T * eps_float64``).

    Returns:
        ``(ratio, relative)``, each ``float64`` ``(...)``.

    Raises:
        TypeError, ValueError: as :func:`singular_values`; ``rtol < 0``.
    """
    return spectral_gap_from_singular_values(singular_values(A), rtol=rtol)

"""Float64 helpers of the attention diagnostics: an attention map read in float64 after its checks, and a division
whose zero denominators the caller masks. The checks themselves are :mod:`coupled_qk.checks.tensors`."""

from __future__ import annotations

import torch

from coupled_qk.checks.tensors import check_matrix, to_f64

F64 = torch.float64
EPS64 = torch.finfo(torch.float64).eps


def map_f64(A: torch.Tensor, name: str = "A") -> torch.Tensor:
    """Validate an attention map's shape (``(..., T, T)``, ``T >= 1``) and return it in float64."""
    if not isinstance(A, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(A).__name__}")
    check_matrix(A, name, "(..., T, T)")
    if A.shape[-1] != A.shape[-2]:
        raise ValueError(f"{name} must be square in its last two dimensions (..., T, T); got shape {tuple(A.shape)}")
    return to_f64(A, name)


def safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den`` where ``den > 0``; the value where ``den <= 0`` is arbitrary (callers mask it)."""
    return num / torch.where(den > 0, den, torch.ones_like(den))

"""Input checks and float64 conversion shared by the attention diagnostics."""

from __future__ import annotations

import torch

F64 = torch.float64
EPS64 = torch.finfo(torch.float64).eps


# ----------------------------------------------------------------------------------------------------------
# validation helpers
# ----------------------------------------------------------------------------------------------------------


def to_f64(x: torch.Tensor, name: str) -> torch.Tensor:
    """``x`` detached in float64; ``TypeError`` for a non-tensor or complex input, ``ValueError`` naming ``name``
    for non-finite entries."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    if x.is_complex():
        raise TypeError(f"{name} must be real; got complex dtype {x.dtype}")
    x64 = x.detach().to(F64)
    if x64.numel() and not bool(torch.isfinite(x64).all()):
        raise ValueError(f"{name} must be finite; got nan/inf in a tensor of shape {tuple(x.shape)}")
    return x64


def check_finite_parameters(model, name: str = "model") -> None:
    """``ValueError`` naming the parameters of ``model`` (an ``nn.Module``) that hold NaN or inf, the first five
    and their count: its attention maps would be non-finite, and no diagnostic of them is defined."""
    bad = [n for n, p in model.named_parameters() if not bool(torch.isfinite(p.detach()).all())]
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise ValueError(
            f"{name} has non-finite (NaN or inf) parameters: {shown} ({len(bad)} of "
            f"{sum(1 for _ in model.parameters())}); its attention maps are undefined, analyse a "
            "model (checkpoint) with finite weights"
        )


def check_finite_activations(layer: int, tensors: dict) -> None:
    """``ValueError`` naming layer ``layer`` and which of ``tensors`` (name -> tensor or ``None``) hold NaN or inf;
    called once the parameters are known finite, so the activations overflowed (no diagnostic is defined)."""
    bad = [name for name, t in tensors.items() if t is not None and not bool(torch.isfinite(t).all())]
    if bad:
        dtype = next(t for t in tensors.values() if t is not None).dtype
        raise ValueError(
            f"layer {layer}: the {' and '.join(bad)} hold NaN or inf although every parameter is finite "
            f"(the activations overflow in {dtype} on these tokens); no diagnostic is defined for them"
        )


def _default_atol(dtype: torch.dtype) -> float:
    return 1e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-4


def check_matrix(x: torch.Tensor, name: str, what: str) -> None:
    """``ValueError`` naming ``name`` unless ``x`` has at least 2 dimensions, the last two non-empty."""
    if x.dim() < 2:
        raise ValueError(f"{name} must have at least 2 dimensions {what}; got shape {tuple(x.shape)} ({x.dim()}-D)")
    if x.shape[-2] < 1 or x.shape[-1] < 1:
        raise ValueError(f"{name} must have non-empty trailing dimensions {what}; got shape {tuple(x.shape)}")


def map_f64(A: torch.Tensor, name: str = "A") -> torch.Tensor:
    """Validate an attention map's shape (``(..., T, T)``, ``T >= 1``) and return it in float64."""
    if not isinstance(A, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(A).__name__}")
    check_matrix(A, name, "(..., T, T)")
    if A.shape[-1] != A.shape[-2]:
        raise ValueError(f"{name} must be square in its last two dimensions (..., T, T); got shape {tuple(A.shape)}")
    return to_f64(A, name)


def check_stochastic(A64: torch.Tensor, name: str, atol: float) -> None:
    """Rows must be probability vectors: entries >= -atol and row sums within atol of 1."""
    if A64.numel() == 0:
        return
    min_entry = float(A64.min())
    if min_entry < -atol:
        raise ValueError(
            f"{name} must have non-negative entries (a probability map); got min entry {min_entry:.3g} "
            f"(atol={atol:g}) in a tensor of shape {tuple(A64.shape)}"
        )
    dev = float((A64.sum(dim=-1) - 1.0).abs().max())
    if dev > atol:
        raise ValueError(
            f"every row of {name} must sum to 1 within atol={atol:g} (a probability map); got "
            f"max |row sum - 1| = {dev:.3g} in a tensor of shape {tuple(A64.shape)}"
        )


def check_causal(A64: torch.Tensor, name: str, atol: float) -> None:
    """``ValueError`` naming ``name`` when an entry above the diagonal of ``A64`` exceeds ``atol`` in magnitude."""
    if A64.numel() == 0:
        return
    upper = float(torch.triu(A64, diagonal=1).abs().max())
    if upper > atol:
        raise ValueError(
            f"{name} must be causal (zeros above the diagonal) when causal=True; got max |entry| "
            f"{upper:.3g} above the diagonal (atol={atol:g}) in a tensor of shape {tuple(A64.shape)}; "
            "pass causal=False for a bidirectional map"
        )


def safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den`` where ``den > 0``; the value where ``den <= 0`` is arbitrary (callers mask it)."""
    return num / torch.where(den > 0, den, torch.ones_like(den))


def resolve_atol(atol: float | None, dtype: torch.dtype) -> float:
    """``atol``, checked ``>= 0``, or the default tolerance of ``dtype`` when ``None``."""
    if atol is None:
        return _default_atol(dtype)
    if not atol >= 0:
        raise ValueError(f"atol must be >= 0; got {atol}")
    return float(atol)

"""Attention entropies and attention-sink mass of (causal) attention maps.

Conventions: :mod:`coupled_qk.analysis.attention_stats` (docs/METHOD.md section 7)."""

from __future__ import annotations

import math

import torch

from coupled_qk.analysis.float64 import F64, map_f64
from coupled_qk.checks.tensors import check_causal, check_stochastic, resolve_atol

# ----------------------------------------------------------------------------------------------------------
# entropy
# ----------------------------------------------------------------------------------------------------------


def row_entropy_f64(A64: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of each row of the float64 attention ``A64`` of shape ``(..., T, T)`` -> ``(..., T)``."""
    p = A64.clamp_min(0.0)  # tiny negatives allowed by atol are rounding noise
    return -torch.special.xlogy(p, p).sum(dim=-1)


def normalized_entropy_f64(H: torch.Tensor, causal: bool) -> torch.Tensor:
    """Mean row entropy ``H`` ``(..., T)`` divided by the largest possible (``log`` of each row's length; causal rows
    1..T-1, row 0 has one key and is skipped) -> ``(...)``."""
    T = H.shape[-1]
    if causal:
        log_len = torch.log(torch.arange(2, T + 1, dtype=F64, device=H.device))  # rows 1..T-1
        return (H[..., 1:] / log_len).mean(dim=-1)
    return H.mean(dim=-1) / math.log(T)


def row_entropy(A: torch.Tensor, *, atol: float | None = None) -> torch.Tensor:
    """Shannon entropy of every row of an attention map, in nats.

    Source: docs/METHOD.md section 7 ("entropy per row in nats").

    Args:
        A: attention map ``(..., T, T)``, any real dtype; each row a probability vector.
        atol: tolerance for the row-sum / non-negativity check (default ``1e-4``, or ``1e-2`` for
            ``bfloat16`` / ``float16`` input).

    Returns:
        ``float64`` tensor ``(..., T)``: ``H_i = -sum_j A_ij log A_ij`` with ``0 log 0 = 0`` (nats).

    Raises:
        TypeError: ``A`` is not a real tensor.
        ValueError: ``A`` is not ``(..., T, T)``, has non-finite entries, entries below ``-atol``, or rows
            whose sum differs from 1 by more than ``atol``.
    """
    A64 = map_f64(A, "A")
    check_stochastic(A64, "A", resolve_atol(atol, A.dtype))
    return row_entropy_f64(A64)


def attention_entropy(A: torch.Tensor, *, atol: float | None = None) -> torch.Tensor:
    """Mean row entropy of an attention map, in nats (all ``T`` rows, row 0 included).

    Source: docs/METHOD.md section 7. For a causal map row 0 always has entropy 0 and is still averaged in;
    use :func:`normalized_attention_entropy` for a length-corrected measure.

    Args:
        A: attention map ``(..., T, T)``, any real dtype; each row a probability vector.
        atol: row-sum tolerance, as in :func:`row_entropy`.

    Returns:
        ``float64`` tensor ``(...)`` in nats.

    Raises:
        TypeError, ValueError: as :func:`row_entropy`.
    """
    return row_entropy(A, atol=atol).mean(dim=-1)


def normalized_attention_entropy(A: torch.Tensor, *, causal: bool = True, atol: float | None = None) -> torch.Tensor:
    """Mean row entropy divided by the log of the number of allowed keys (dimensionless, in ``[0, 1]``).

    Source: docs/METHOD.md section 7 (our normalisation). With ``causal=True`` row ``i`` (0-based) has ``i + 1``
    allowed keys and ``H_i / log(i + 1)`` is averaged over rows ``1 .. T-1``; **row 0 is excluded** (its
    length is 1 and ``log 1 = 0``). With ``causal=False`` every row has ``T`` allowed keys and the result is
    ``mean_i H_i / log T`` over all rows. A uniform distribution over the allowed keys gives exactly 1.

    Args:
        A: attention map ``(..., T, T)`` with ``T >= 2``, any real dtype; rows are probability vectors and,
            if ``causal``, entries above the diagonal are zero (within ``atol``).
        causal: whether ``A`` is a causal (lower-triangular) map.
        atol: tolerance for the row-sum and causality checks, as in :func:`row_entropy`.

    Returns:
        ``float64`` tensor ``(...)``.

    Raises:
        TypeError: ``A`` is not a real tensor.
        ValueError: as :func:`row_entropy`; also if ``T < 2`` or (``causal=True``) mass above the diagonal.
    """
    A64 = map_f64(A, "A")
    T = A64.shape[-1]
    if T < 2:
        raise ValueError(
            f"normalized entropy needs T >= 2 (row 0 has log(1) = 0 and is excluded); got A of shape {tuple(A.shape)}"
        )
    tol = resolve_atol(atol, A.dtype)
    check_stochastic(A64, "A", tol)
    if causal:
        check_causal(A64, "A", tol)
    return normalized_entropy_f64(row_entropy_f64(A64), causal)


# ----------------------------------------------------------------------------------------------------------
# attention sink
# ----------------------------------------------------------------------------------------------------------


def sink_mass_f64(A64: torch.Tensor, include_first_row: bool) -> torch.Tensor:
    """Mean attention on the first key over the query rows of ``A64`` ``(..., T, T)`` -> ``(...)``."""
    col0 = A64[..., :, 0]
    return (col0 if include_first_row else col0[..., 1:]).mean(dim=-1)


def sink_mass(A: torch.Tensor, *, include_first_row: bool = False) -> torch.Tensor:
    """Attention-sink mass: mean over query rows of the attention on the first key, ``mean_i A[i, 0]``.

    Source: docs/METHOD.md section 7 (attention-sink mass; the phenomenon is from Xiao et al. 2023, "Efficient
    streaming language models with attention sinks"). By default row 0 is **excluded** (in a causal map it
    trivially puts mass 1 on key 0), i.e. the mean runs over rows ``1 .. T-1``; ``include_first_row=True``
    averages over all ``T`` rows. No row-sum requirement (the value is a fraction of attention mass only
    when rows sum to 1).

    Args:
        A: map ``(..., T, T)``, any real dtype; ``T >= 2`` unless ``include_first_row``.
        include_first_row: include row 0 in the mean.

    Returns:
        ``float64`` tensor ``(...)``; in ``[0, 1]`` for probability maps.

    Raises:
        TypeError: ``A`` is not a real tensor.
        ValueError: ``A`` is not ``(..., T, T)``, has non-finite entries, or ``T < 2`` with row 0 excluded.
    """
    A64 = map_f64(A, "A")
    if not include_first_row and A64.shape[-1] < 2:
        raise ValueError(
            f"sink mass excluding row 0 needs T >= 2; got A of shape {tuple(A.shape)} (pass include_first_row=True)"
        )
    return sink_mass_f64(A64, include_first_row)

"""Pure-math attention diagnostics (PAPER.md section 7).

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
"""

from __future__ import annotations

import math

import torch

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

_F64 = torch.float64
_EPS64 = torch.finfo(torch.float64).eps


# ----------------------------------------------------------------------------------------------------------
# validation helpers
# ----------------------------------------------------------------------------------------------------------


def _to_f64(x: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    if x.is_complex():
        raise TypeError(f"{name} must be real; got complex dtype {x.dtype}")
    x64 = x.detach().to(_F64)
    if x64.numel() and not bool(torch.isfinite(x64).all()):
        raise ValueError(f"{name} must be finite; got nan/inf in a tensor of shape {tuple(x.shape)}")
    return x64


def _default_atol(dtype: torch.dtype) -> float:
    return 1e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-4


def _check_matrix(x: torch.Tensor, name: str, what: str) -> None:
    if x.dim() < 2:
        raise ValueError(
            f"{name} must have at least 2 dimensions {what}; got shape {tuple(x.shape)} ({x.dim()}-D)"
        )
    if x.shape[-2] < 1 or x.shape[-1] < 1:
        raise ValueError(f"{name} must have non-empty trailing dimensions {what}; got shape {tuple(x.shape)}")


def _map_f64(A: torch.Tensor, name: str = "A") -> torch.Tensor:
    """Validate an attention map's shape (``(..., T, T)``, ``T >= 1``) and return it in float64."""
    if not isinstance(A, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(A).__name__}")
    _check_matrix(A, name, "(..., T, T)")
    if A.shape[-1] != A.shape[-2]:
        raise ValueError(
            f"{name} must be square in its last two dimensions (..., T, T); got shape {tuple(A.shape)}"
        )
    return _to_f64(A, name)


def _check_stochastic(A64: torch.Tensor, name: str, atol: float) -> None:
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


def _check_causal(A64: torch.Tensor, name: str, atol: float) -> None:
    if A64.numel() == 0:
        return
    upper = float(torch.triu(A64, diagonal=1).abs().max())
    if upper > atol:
        raise ValueError(
            f"{name} must be causal (zeros above the diagonal) when causal=True; got max |entry| "
            f"{upper:.3g} above the diagonal (atol={atol:g}) in a tensor of shape {tuple(A64.shape)}; "
            "pass causal=False for a bidirectional map"
        )


def _safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den`` where ``den > 0``; the value where ``den <= 0`` is arbitrary (callers mask it)."""
    return num / torch.where(den > 0, den, torch.ones_like(den))


def _resolve_atol(atol: float | None, dtype: torch.dtype) -> float:
    if atol is None:
        return _default_atol(dtype)
    if not atol >= 0:
        raise ValueError(f"atol must be >= 0; got {atol}")
    return float(atol)


# ----------------------------------------------------------------------------------------------------------
# entropy
# ----------------------------------------------------------------------------------------------------------


def _row_entropy_f64(A64: torch.Tensor) -> torch.Tensor:
    p = A64.clamp_min(0.0)  # tiny negatives allowed by atol are rounding noise
    return -torch.special.xlogy(p, p).sum(dim=-1)


def _normalized_entropy_f64(H: torch.Tensor, causal: bool) -> torch.Tensor:
    T = H.shape[-1]
    if causal:
        log_len = torch.log(torch.arange(2, T + 1, dtype=_F64, device=H.device))  # rows 1..T-1
        return (H[..., 1:] / log_len).mean(dim=-1)
    return H.mean(dim=-1) / math.log(T)


def row_entropy(A: torch.Tensor, *, atol: float | None = None) -> torch.Tensor:
    """Shannon entropy of every row of an attention map, in nats.

    Source: PAPER.md section 7 ("entropy per row in nats").

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
    A64 = _map_f64(A, "A")
    _check_stochastic(A64, "A", _resolve_atol(atol, A.dtype))
    return _row_entropy_f64(A64)


def attention_entropy(A: torch.Tensor, *, atol: float | None = None) -> torch.Tensor:
    """Mean row entropy of an attention map, in nats (all ``T`` rows, row 0 included).

    Source: PAPER.md section 7. For a causal map row 0 always has entropy 0 and is still averaged in;
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


def normalized_attention_entropy(
    A: torch.Tensor, *, causal: bool = True, atol: float | None = None
) -> torch.Tensor:
    """Mean row entropy divided by the log of the number of allowed keys (dimensionless, in ``[0, 1]``).

    Source: PAPER.md section 7 (our normalisation). With ``causal=True`` row ``i`` (0-based) has ``i + 1``
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
    A64 = _map_f64(A, "A")
    T = A64.shape[-1]
    if T < 2:
        raise ValueError(
            f"normalized entropy needs T >= 2 (row 0 has log(1) = 0 and is excluded); got A of shape "
            f"{tuple(A.shape)}"
        )
    tol = _resolve_atol(atol, A.dtype)
    _check_stochastic(A64, "A", tol)
    if causal:
        _check_causal(A64, "A", tol)
    return _normalized_entropy_f64(_row_entropy_f64(A64), causal)


# ----------------------------------------------------------------------------------------------------------
# spectrum
# ----------------------------------------------------------------------------------------------------------


def _default_rtol(s: torch.Tensor, rtol: float | None) -> float:
    if rtol is None:
        return s.shape[-1] * _EPS64
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
    s64 = _to_f64(s, name)
    if s64.numel() and float(s64.min()) < 0:
        raise ValueError(f"{name} must be non-negative singular values; got min {float(s64.min()):.3g}")
    return s64


def singular_values(A: torch.Tensor) -> torch.Tensor:
    """Singular values of each map, sorted descending (batched ``torch.linalg.svdvals`` in float64).

    Source: PAPER.md section 7 (singular-value spectrum). No row-sum requirement.

    Args:
        A: map ``(..., T, T)``, any real dtype.

    Returns:
        ``float64`` tensor ``(..., T)``, non-negative, descending along the last axis.

    Raises:
        TypeError: ``A`` is not a real tensor.
        ValueError: ``A`` is not ``(..., T, T)`` or has non-finite entries.
    """
    return torch.linalg.svdvals(_map_f64(A, "A"))


def effective_rank_from_singular_values(s: torch.Tensor, *, rtol: float | None = None) -> torch.Tensor:
    """Effective rank ``exp(H(p))``, ``p = sigma / sum(sigma)``, from precomputed singular values.

    Source: Roy & Vetterli 2007, "The effective rank: a measure of effective dimensionality" (EUSIPCO);
    PAPER.md section 7. ``H`` is the Shannon entropy in nats with ``0 log 0 = 0``; the result lies in
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
    p = _safe_div(s64, total)
    erank = torch.exp(-torch.special.xlogy(p, p).sum(dim=-1))
    return torch.where(total.squeeze(-1) > 0, erank, torch.zeros_like(erank))


def effective_rank(A: torch.Tensor, *, rtol: float | None = None) -> torch.Tensor:
    """Effective rank of each map (Roy & Vetterli 2007): ``exp`` of the entropy of normalised singular values.

    Source: Roy & Vetterli 2007; PAPER.md section 7. See :func:`effective_rank_from_singular_values` for
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

    Source: PAPER.md section 7. ``sigma2 <= rtol * sigma1`` (default ``rtol = k * eps_float64``) counts as
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
    ratio = torch.where(s2 > 0, _safe_div(s1, s2), torch.full_like(s1, math.inf))
    ratio = torch.where(s1 > 0, ratio, nan)
    relative = torch.where(s1 > 0, _safe_div(s1 - s2, s1), nan)
    return ratio, relative


def spectral_gap(A: torch.Tensor, *, rtol: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Spectral gap of each map: ``(sigma1 / sigma2, (sigma1 - sigma2) / sigma1)``.

    Source: PAPER.md section 7. Conventions for ``sigma2 = 0`` (``inf`` and ``1.0``) and the zero matrix
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


# ----------------------------------------------------------------------------------------------------------
# attention sink
# ----------------------------------------------------------------------------------------------------------


def _sink_mass_f64(A64: torch.Tensor, include_first_row: bool) -> torch.Tensor:
    col0 = A64[..., :, 0]
    return (col0 if include_first_row else col0[..., 1:]).mean(dim=-1)


def sink_mass(A: torch.Tensor, *, include_first_row: bool = False) -> torch.Tensor:
    """Attention-sink mass: mean over query rows of the attention on the first key, ``mean_i A[i, 0]``.

    Source: PAPER.md section 7 (attention-sink mass; the phenomenon is from Xiao et al. 2023, "Efficient
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
    A64 = _map_f64(A, "A")
    if not include_first_row and A64.shape[-1] < 2:
        raise ValueError(
            f"sink mass excluding row 0 needs T >= 2; got A of shape {tuple(A.shape)} "
            "(pass include_first_row=True)"
        )
    return _sink_mass_f64(A64, include_first_row)


# ----------------------------------------------------------------------------------------------------------
# rank collapse and update size
# ----------------------------------------------------------------------------------------------------------


def _l1inf_norm(X: torch.Tensor) -> torch.Tensor:
    """Composite norm ``sqrt(||X||_1 ||X||_inf)`` (max absolute column sum times max absolute row sum)."""
    a = X.abs()
    return torch.sqrt(a.sum(dim=-2).amax(dim=-1) * a.sum(dim=-1).amax(dim=-1))


def rank_collapse_residual(X: torch.Tensor, *, norm: str = "fro") -> torch.Tensor:
    """Relative distance of a layer output from the rank-1 matrices ``1 x^T`` (token uniformity).

    Source: Dong, Cordonnier & Loukas 2021, "Attention is not all you need: pure attention loses rank
    doubly exponentially with depth" (ICML; arXiv:2103.03404): ``res(X) = X - 1 x^T`` with
    ``x = argmin_x ||X - 1 x^T||``. Our convention (PAPER.md section 7):

    * ``norm="fro"`` (default): ``||X - 1 mean(X)^T||_F / ||X||_F``. Under the Frobenius norm the minimiser
      is exactly the column mean ``x = mean_i X[i, :]``, so this is the exact relative residual. In
      ``[0, 1]``.
    * ``norm="l1inf"``: Dong et al.'s composite norm ``||M||_{1,inf} = sqrt(||M||_1 ||M||_inf)`` (max
      absolute column sum times max absolute row sum), ratio ``||X - 1 x^T||_{1,inf} / ||X||_{1,inf}`` with
      ``x`` the column-wise median (mean of the two middle values for even ``T``). The median minimises
      the ``||.||_1`` factor exactly; the composite minimum has no closed form, so this is an upper bound
      on Dong et al.'s exact residual.

    ``X = 0`` returns 0 (it equals ``1 0^T``).

    Args:
        X: layer output ``(..., T, d)`` (tokens along ``-2``, features along ``-1``), any real dtype.
        norm: ``"fro"`` or ``"l1inf"``.

    Returns:
        ``float64`` tensor ``(...)``; 0 exactly when every token row is identical.

    Raises:
        TypeError: ``X`` is not a real tensor.
        ValueError: ``X`` has fewer than 2 dimensions, an empty trailing axis, non-finite entries, or
            ``norm`` is not one of ``"fro"``, ``"l1inf"``.
    """
    if not isinstance(X, torch.Tensor):
        raise TypeError(f"X must be a torch.Tensor; got {type(X).__name__}")
    _check_matrix(X, "X", "(..., T, d)")
    X64 = _to_f64(X, "X")
    if norm == "fro":
        R = X64 - X64.mean(dim=-2, keepdim=True)
        num = torch.linalg.matrix_norm(R, ord="fro")
        den = torch.linalg.matrix_norm(X64, ord="fro")
    elif norm == "l1inf":
        T = X64.shape[-2]
        srt = X64.sort(dim=-2).values
        med = 0.5 * (srt[..., (T - 1) // 2 : (T - 1) // 2 + 1, :] + srt[..., T // 2 : T // 2 + 1, :])
        num = _l1inf_norm(X64 - med)
        den = _l1inf_norm(X64)
    else:
        raise ValueError(f"norm must be 'fro' or 'l1inf'; got {norm!r}")
    return torch.where(den > 0, _safe_div(num, den), torch.zeros_like(den))


def relative_update(x_new: torch.Tensor, x: torch.Tensor, *, eps: float = 1e-12) -> torch.Tensor:
    """Relative update size ``mean_i ||x_new[i] - x[i]||_2 / (||x[i]||_2 + eps)`` over rows (tokens).

    Source: PAPER.md section 1 (coupled query-key dynamics): measures how far the dynamics move each
    token's query or key, e.g. ``relative_update(q_n, q_0)``. Norms are Euclidean over the last (feature)
    axis; the ratio is averaged over the row axis ``-2``. Dimensionless.

    Args:
        x_new: updated state ``(..., T, d)``, any real dtype.
        x: reference state, same shape as ``x_new`` (no broadcasting).
        eps: added to each reference row norm (``>= 0``); a zero reference row with no change gives 0.

    Returns:
        ``float64`` tensor ``(...)``.

    Raises:
        TypeError: an input is not a real tensor.
        ValueError: shapes differ, fewer than 2 dimensions, empty trailing axes, non-finite entries, or
            ``eps < 0``.
    """
    for name, t in (("x_new", x_new), ("x", x)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
        _check_matrix(t, name, "(..., T, d)")
    if x_new.shape != x.shape:
        raise ValueError(
            f"x_new and x must have the same shape (..., T, d); got x_new {tuple(x_new.shape)} and "
            f"x {tuple(x.shape)}"
        )
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0; got {eps}")
    xn = _to_f64(x_new, "x_new")
    x0 = _to_f64(x, "x")
    diff = torch.linalg.vector_norm(xn - x0, dim=-1)
    ref = torch.linalg.vector_norm(x0, dim=-1) + eps
    ratio = torch.where(diff > 0, _safe_div(diff, ref), torch.zeros_like(diff))
    ratio = torch.where((diff > 0) & (ref == 0), torch.full_like(diff, math.inf), ratio)
    return ratio.mean(dim=-1)


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
    _check_stochastic(A64, name, tol)
    if causal:
        _check_causal(A64, name, tol)
    H = _row_entropy_f64(A64)
    out = {
        "entropy": H.mean(dim=-1),
        "normalized_entropy": _normalized_entropy_f64(H, causal),
        "sink_mass": _sink_mass_f64(A64, include_first_row),
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
    """All map diagnostics of PAPER.md section 7 at once (one batched SVD).

    Source: PAPER.md section 7; effective rank from Roy & Vetterli 2007. Keys (all ``float64``):

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
    A64 = _map_f64(A, "A")
    return _summarize_f64(A64, "A", _resolve_atol(atol, A.dtype), causal, include_first_row, rtol)


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

    Source: Ye et al. 2024, "Differential Transformer" (arXiv:2410.05258); PAPER.md sections 2 and 7.

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
    A1_64 = _map_f64(A1, "A1")
    A2_64 = _map_f64(A2, "A2")
    if A1.shape != A2.shape:
        raise ValueError(
            f"A1 and A2 must have the same shape (..., T, T); got A1 {tuple(A1.shape)} and "
            f"A2 {tuple(A2.shape)}"
        )
    if isinstance(lam, torch.Tensor):
        lam64 = _to_f64(lam, "lam")
    elif isinstance(lam, (int, float)) and not isinstance(lam, bool):
        if not math.isfinite(lam):
            raise ValueError(f"lam must be finite; got {lam}")
        lam64 = torch.tensor(float(lam), dtype=_F64, device=A1_64.device)
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
        tol = _resolve_atol(atol, orig.dtype)
        for key, val in _summarize_f64(A64, name.upper(), tol, causal, include_first_row, rtol).items():
            out[f"{name}/{key}"] = val
    signed = A1_64 - lam64.to(A1_64.device)[..., None, None] * A2_64
    for key, val in _spectral_summary(torch.linalg.svdvals(signed), rtol).items():
        out[f"signed/{key}"] = val
    return out

"""Rank collapse of hidden states (Dong et al. 2021) and relative update sizes of the query-key maps.

Conventions: :mod:`coupled_qk.analysis.attention_stats` (docs/METHOD.md section 7)."""

from __future__ import annotations

import math

import torch

from coupled_qk.analysis.float64 import safe_div
from coupled_qk.checks.tensors import check_matrix, to_f64

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
    ``x = argmin_x ||X - 1 x^T||``. Our convention (docs/METHOD.md section 7):

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
    check_matrix(X, "X", "(..., T, d)")
    X64 = to_f64(X, "X")
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
    return torch.where(den > 0, safe_div(num, den), torch.zeros_like(den))


def relative_update(x_new: torch.Tensor, x: torch.Tensor, *, eps: float = 1e-12) -> torch.Tensor:
    """Relative update size ``mean_i ||x_new[i] - x[i]||_2 / (||x[i]||_2 + eps)`` over rows (tokens).

    Source: docs/METHOD.md section 1 (coupled query-key dynamics): measures how far the dynamics move each
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
        check_matrix(t, name, "(..., T, d)")
    if x_new.shape != x.shape:
        raise ValueError(
            f"x_new and x must have the same shape (..., T, d); got x_new {tuple(x_new.shape)} and x {tuple(x.shape)}"
        )
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0; got {eps}")
    xn = to_f64(x_new, "x_new")
    x0 = to_f64(x, "x")
    diff = torch.linalg.vector_norm(xn - x0, dim=-1)
    ref = torch.linalg.vector_norm(x0, dim=-1) + eps
    ratio = torch.where(diff > 0, safe_div(diff, ref), torch.zeros_like(diff))
    ratio = torch.where((diff > 0) & (ref == 0), torch.full_like(diff, math.inf), ratio)
    return ratio.mean(dim=-1)

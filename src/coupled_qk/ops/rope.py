"""Rotary position embedding (Su et al. 2021, "RoFormer", arXiv:2104.09864), rotate-half convention."""

from __future__ import annotations

import torch


def rope_tables(
    n_positions: int,
    d_head: int,
    base: float = 10000.0,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine and sine tables for RoPE.

    Args:
        n_positions: number of positions ``T`` (``>= 1``).
        d_head: head width; must be even.
        base: frequency base (10000 as in RoFormer and GPT-NeoX).

    Returns:
        ``(cos, sin)``, each of shape ``(T, d_head)`` in ``dtype``; frequencies are duplicated across the two
        halves of the last axis (the GPT-NeoX rotate-half layout).

    Raises:
        ValueError: if ``d_head`` is odd or ``n_positions < 1``.
    """
    if d_head % 2:
        raise ValueError(f"RoPE needs an even d_head; got d_head={d_head}")
    if n_positions < 1:
        raise ValueError(f"n_positions={n_positions} must be >= 1")
    inv_freq = 1.0 / (base ** (torch.arange(0, d_head, 2, device=device, dtype=torch.float64) / d_head))
    angles = torch.outer(torch.arange(n_positions, device=device, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """``sin`` of shape ``(..., d_head)`` with its first half negated: the table :func:`apply_rope` multiplies the
    swapped halves by, so that the rotation is one ``cat`` and one ``addcmul`` (precompute it with the tables)."""
    s1, s2 = sin.chunk(2, dim=-1)
    return torch.cat([-s1, s2], dim=-1)


def apply_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sin_signed: torch.Tensor | None = None
) -> torch.Tensor:
    """Rotate ``x`` of shape ``(..., T, d_head)`` by the tables ``cos, sin`` of shape ``(T, d_head)``.

    Returns a tensor of the shape and dtype of ``x``: ``x cos + rotate_half(x) sin`` with ``rotate_half(x) =
    (-x2, x1)``. Dot products of rotated queries and keys depend only on the difference of their positions.
    ``sin_signed``: :func:`signed_sin` of ``sin``, precomputed (the model keeps it with its tables); the
    rotation is then ``addcmul(x cos, (x2, x1), sin_signed)``, three kernels instead of five (RoPE at
    decoding cost); equal to the plain form up to float rounding.
    """
    x1, x2 = x.chunk(2, dim=-1)
    if sin_signed is None:
        sin_signed = signed_sin(sin)
    return torch.addcmul(x * cos.to(x.dtype), torch.cat([x2, x1], dim=-1), sin_signed.to(x.dtype))

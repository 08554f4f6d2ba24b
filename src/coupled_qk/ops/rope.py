"""Rotary position embedding (Su et al. 2021, "RoFormer", arXiv:2104.09864), rotate-half convention."""

from __future__ import annotations

import torch


def rope_tables(
    n_positions: int, d_head: int, base: float = 10000.0, device=None, dtype=torch.float32
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


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` of shape ``(..., T, d_head)`` by the tables ``cos, sin`` of shape ``(T, d_head)``.

    Returns a tensor of the shape and dtype of ``x``. Dot products of rotated queries and keys depend only
    on the difference of their positions.
    """
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)

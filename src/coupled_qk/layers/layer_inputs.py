"""Checks of what a user's model passes to :class:`coupled_qk.layers.attention.CausalSelfAttention`.

Metadata only (shapes, dtypes, devices: no device sync), once per call of the layer; a model that guarantees its
inputs (:class:`coupled_qk.GPT` checks token ids, masks and positions at its entry) turns them off with
``layer.check_every_call = False``. Each error names the argument, what it got and what was expected, where
PyTorch would fail deep inside the layer ("mat1 and mat2 shapes cannot be multiplied", "bitwise_and_cpu not
implemented for 'Float'") or broadcast silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
import torch.nn as nn


def autocast_on(device_type: str) -> bool:
    """Whether ``torch.autocast`` is on for ``device_type`` (a device type autocast does not know: the default one)."""
    try:
        return torch.is_autocast_enabled(device_type)
    except (TypeError, RuntimeError):  # torch < 2.4 has no device argument; an unknown device type
        return torch.is_autocast_enabled()


class CheckedLayer(Protocol):
    """What :func:`check_layer_inputs` reads of the layer it checks
    (:class:`~coupled_qk.layers.attention.CausalSelfAttention`, which imports this module)."""

    qkv: nn.Linear
    use_rope: bool
    d_head: int


def check_x(x: torch.Tensor, weight: torch.Tensor) -> None:
    """``x`` is a floating ``(B, T, d_model)`` tensor on the device and of the dtype of ``weight`` (the layer's
    input projection ``(out, d_model)``), or of any floating dtype under ``torch.autocast``."""
    d_model = weight.shape[-1]
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor of shape (B, T, d_model={d_model}); got {type(x).__name__}")
    if x.dim() != 3 or x.shape[-1] != d_model:
        raise ValueError(f"x must have shape (B, T, d_model={d_model}); got {tuple(x.shape)}")
    if x.device != weight.device:
        raise ValueError(f"x is on {x.device} but the layer is on {weight.device}; move one with .to()")
    if not x.is_floating_point():
        raise ValueError(f"x must be a floating-point tensor; got dtype {x.dtype}")
    if x.dtype != weight.dtype and not autocast_on(x.device.type):
        raise ValueError(
            f"x has dtype {x.dtype} but the layer's parameters are {weight.dtype}; convert one with "
            ".to() or run under torch.autocast"
        )


def check_rope(rope: Sequence[torch.Tensor] | None, use_rope: bool, b: int, t: int, d_head: int) -> None:
    """``rope`` is ``(cos, sin)`` or ``(cos, sin, signed sin)`` of shape ``(T, d_head)`` or ``(B or 1, 1, T,
    d_head)`` when the layer applies RoPE, and ``None`` when it does not (a table it would ignore is refused)."""
    if not use_rope:
        if rope is not None:
            raise ValueError(
                "rope was given but the layer was built with use_rope=False (it would be ignored); "
                "pass rope=None, or build the layer with use_rope=True"
            )
        return
    if not isinstance(rope, (tuple, list)) or len(rope) not in (2, 3):
        raise TypeError(
            f"rope must be the RoPE tables (cos, sin) of the current positions "
            f"(coupled_qk.ops.rope.rope_tables) for a layer with use_rope=True; got {type(rope).__name__}"
            + (f" of length {len(rope)}" if isinstance(rope, (tuple, list)) else "")
        )
    for name, table in zip(("cos", "sin", "signed sin"), rope):
        if not isinstance(table, torch.Tensor):
            raise TypeError(f"rope's {name} table must be a torch.Tensor; got {type(table).__name__}")
        shape = tuple(table.shape)
        if shape != (t, d_head) and not (len(shape) == 4 and shape[0] in (1, b) and shape[1:] == (1, t, d_head)):
            raise ValueError(
                f"rope's {name} table must have shape (T, d_head) = ({t}, {d_head}) or (B, 1, T, d_head) "
                f"= ({b}, 1, {t}, {d_head}) for x of {t} tokens; got {shape}"
            )


def check_key_mask(key_mask: torch.Tensor | None, b: int) -> None:
    """``key_mask`` is ``None`` or a bool ``(B or 1, T_k)`` tensor (its length is checked against the keys by
    :func:`coupled_qk.layers.scoring.attention_mask_4d`)."""
    if key_mask is None:
        return
    if not isinstance(key_mask, torch.Tensor):
        raise TypeError(
            f"key_mask must be a bool torch.Tensor of shape (B, T_past + T) or None; got {type(key_mask).__name__}"
        )
    if key_mask.dim() != 2 or key_mask.shape[0] not in (1, b):
        raise ValueError(
            f"key_mask must have shape (B, T_past + T) with B={b} (a key-padding mask, not a (T, T) or "
            f"4-D attention mask: the layer is causal itself); got {tuple(key_mask.shape)}"
        )


def check_layer_inputs(
    layer: CheckedLayer, x: torch.Tensor, rope: Sequence[torch.Tensor] | None, key_mask: torch.Tensor | None
) -> None:
    """All the checks above for one call of ``layer`` (a ``CausalSelfAttention``).

    Raises:
        TypeError: ``x``, ``rope`` or ``key_mask`` of the wrong kind. ValueError: a wrong shape, dtype or
            device, naming the argument.
    """
    check_x(x, layer.qkv.weight)
    check_rope(rope, layer.use_rope, x.shape[0], x.shape[1], layer.d_head)
    check_key_mask(key_mask, x.shape[0])

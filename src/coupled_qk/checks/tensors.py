"""Checks of tensor entry points and sampling arguments, run once per call (never per layer or per token).

Used at the top of :meth:`coupled_qk.GPT.generate` (and available to the Hugging Face wrapper): every argument
is checked for type, shape (zero-sized dimensions included), dtype, device, finiteness and range, raising
``TypeError`` (wrong kind of object) or ``ValueError`` (wrong value) whose message names the argument. The
attention diagnostics (:mod:`coupled_qk.analysis`) check what they read here too: a finite real tensor in float64
(:func:`to_f64`), a matrix, a probability map (rows on the simplex, causal) within a tolerance (:func:`resolve_atol`).

Level 0 of the layering (torch and :mod:`coupled_qk.checks.values` only).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = [
    "check_attention_mask",
    "check_causal",
    "check_generate_args",
    "check_greedy_extras",
    "check_ids",
    "check_left_padded",
    "check_matrix",
    "check_position_ids",
    "check_stochastic",
    "resolve_atol",
    "to_f64",
]

GREEDY_BELOW = torch.finfo(torch.float32).tiny
"""A sampling temperature below this decodes greedily (the arg-max; sampling logits are float32)."""
_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _int(name: str, value, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}={value!r} must be an int (got {type(value).__name__})")
    if value < lo:
        raise ValueError(f"{name}={value!r} must be >= {lo}")
    return value


def _real(name: str, value, lo: float, hi: float | None = None, lo_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}={value!r} must be a real number (got {type(value).__name__})")
    if not math.isfinite(value):
        raise ValueError(f"{name}={value!r} must be finite")
    if value < lo or (lo_open and value == lo) or (hi is not None and value > hi):
        left = "(" if lo_open else "["
        raise ValueError(f"{name}={value!r} must be in {left}{lo:g}, {'inf' if hi is None else f'{hi:g}'}]")
    return float(value)


def check_ids(name: str, idx, *, vocab_size: int | None = None, allow_empty_time: bool = False) -> None:
    """``idx`` must be an integer tensor of shape ``(B, T)`` with ``B >= 1`` (and ``T >= 1`` unless
    ``allow_empty_time``), ids in ``[0, vocab_size)`` (checked on CPU tensors only, to avoid a device sync).

    Raises:
        TypeError: not a tensor. ValueError: naming ``name``: wrong rank, zero-sized dimension, floating or
            bool dtype, an id out of range.
    """
    if not isinstance(idx, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids with shape (B, T); got {type(idx).__name__}")
    if idx.dim() != 2:
        raise ValueError(f"{name} must have shape (B, T); got shape {tuple(idx.shape)}")
    if idx.dtype not in _INT_DTYPES:
        raise ValueError(f"{name} must hold integer token ids; got dtype {idx.dtype}")
    if idx.shape[0] == 0 or (idx.shape[1] == 0 and not allow_empty_time):
        raise ValueError(
            f"{name} has a zero-sized dimension: shape {tuple(idx.shape)}; need at least one sequence "
            "of at least one token (e.g. the end-of-text id)"
        )
    if vocab_size is not None and idx.numel() and idx.device.type == "cpu":
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"{name}: token ids must be in [0, {vocab_size}); got min {lo}, max {hi}")


def check_generate_args(
    idx,
    max_new_tokens,
    *,
    block_size: int,
    vocab_size: int,
    temperature=1.0,
    top_k=None,
    top_p=None,
    repetition_penalty=None,
    stop_ids: Sequence[int] | None = None,
    use_cache=True,
    generator=None,
    attention_mask=None,
    device: torch.device | None = None,
    fit_context: bool = True,
    name: str = "idx",
) -> None:
    """Check every argument of a sampling call once, before any token is computed.

    Args:
        idx: ``(B, T)`` integer prompt ids, ``B, T >= 1``, ids in ``[0, vocab_size)``.
        max_new_tokens: int ``>= 0``; ``T + max_new_tokens <= block_size`` when ``fit_context``.
        temperature: finite real ``>= 0`` (``0``: greedy).
        top_k: ``None`` or int ``>= 1``.
        top_p: ``None`` or finite real in ``(0, 1]``.
        repetition_penalty: ``None`` or finite real ``> 0``.
        stop_ids: ``None`` or a sequence of ints in ``[0, vocab_size)``.
        use_cache: bool.
        generator: ``None`` or a ``torch.Generator`` on ``idx``'s device type.
        attention_mask: ``None`` or a bool/integer tensor of ``idx``'s shape and device, values 0/1, at least
            one real token per row, padded on the left only (:func:`check_left_padded`).
        device: the model's device; ``idx`` must be on it.
        fit_context: whether prompt plus new tokens must fit ``block_size`` (``False`` for a sliding window).
        name: what messages call the prompt (``"input_ids"`` for the Hugging Face wrapper).

    Raises:
        TypeError: a wrong kind of object (a float for an int, a string for a bool, a list for a tensor).
        ValueError: a value out of range, non-finite, a zero-sized or mismatched shape, a wrong dtype or
            device, a total length beyond ``block_size``. Each message names the argument.
    """
    check_ids(name, idx, vocab_size=vocab_size)
    _int("max_new_tokens", max_new_tokens, 0)
    total = idx.shape[1] + max_new_tokens
    if fit_context and total > block_size:
        raise ValueError(
            f"prompt length {idx.shape[1]} + max_new_tokens={max_new_tokens} = {total} exceeds "
            f"block_size={block_size} (no silent cropping)"
        )
    _real("temperature", temperature, 0.0)
    if top_k is not None:
        _int("top_k", top_k, 1)
    if top_p is not None:
        _real("top_p", top_p, 0.0, 1.0, lo_open=True)
    if repetition_penalty is not None:
        _real("repetition_penalty", repetition_penalty, 0.0, lo_open=True)
    if stop_ids is not None:
        _check_stop_ids(stop_ids, vocab_size)
    if not isinstance(use_cache, bool):
        raise TypeError(f"use_cache={use_cache!r} must be True or False")
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None; got {type(generator).__name__}")
        if generator.device.type != idx.device.type:
            raise ValueError(f"generator is on {generator.device} but {name} is on {idx.device}")
    if device is not None and idx.device.type != torch.device(device).type:
        raise ValueError(f"{name} is on {idx.device} but the model is on {device}")
    if attention_mask is not None:
        _check_mask(attention_mask, idx, name)
        check_left_padded(attention_mask)


def check_left_padded(attention_mask: torch.Tensor) -> None:
    """Refuse a prompt mask ``(B, T)`` (0 at padding) with padding after a real token: right padding (or a gap).
    Generation continues every row after its last position, so a right-padded row's new tokens would be predicted
    from a padding position and follow the padding: not what its prompt generates alone. A forward accepts any
    padding (each real position's logits are exact); sampling needs the prompts padded on the left, as in
    ``transformers`` for every decoder-only model. Checked on any device (one read per call, not per token).

    Raises:
        ValueError: naming ``attention_mask``, the first such row and what to do.
    """
    real = attention_mask.bool()
    late = real.int().cummax(dim=1).values.bool() & ~real  # padding after the row's first real token
    rows = late.any(dim=1)
    if bool(rows.any()):
        row = int(rows.nonzero()[0, 0])
        raise ValueError(
            f"attention_mask row {row} has padding after its real tokens (right padding): generation continues "
            "each row after its last position, so its new tokens would follow the padding; pad prompts on the "
            "left (a Hugging Face tokenizer: padding_side='left'), or generate rows of different lengths "
            "one by one"
        )


def check_greedy_extras(temperature, top_k, generator) -> None:
    """Refuse sampling arguments that greedy decoding would silently ignore (:meth:`coupled_qk.GPT.generate`;
    the command line refuses ``--top-k``/``--seed`` with ``--temperature 0`` the same way).

    A ``temperature`` below float32's smallest normal number (``0`` included) decodes greedily
    (:func:`coupled_qk.models.generation.sample_next_token` takes the arg-max), so ``top_k`` and ``generator``
    change no token there. Call after :func:`check_generate_args` (``temperature`` is a finite real >= 0).

    Raises:
        ValueError: ``top_k`` or ``generator`` given (not ``None``) with a greedy ``temperature``, naming it.
    """
    if temperature >= GREEDY_BELOW:
        return
    for name, value in (("top_k", top_k), ("generator", generator)):
        if value is not None:
            raise ValueError(
                f"{name}={value!r} has no effect with temperature={temperature!r} (greedy decoding: the most likely "
                f"token at every step, nothing is sampled); pass {name}=None, or a temperature > 0 to sample"
            )


def _check_stop_ids(stop_ids, vocab_size: int) -> None:
    """``stop_ids``: a sequence (not a string) of ints in ``[0, vocab_size)``."""
    if isinstance(stop_ids, (str, bytes)) or not isinstance(stop_ids, Sequence):
        raise TypeError(f"stop_ids={stop_ids!r} must be a sequence of token ids")
    for i, s in enumerate(stop_ids):
        _int(f"stop_ids[{i}]", s, 0)
        if s >= vocab_size:
            raise ValueError(f"stop_ids[{i}]={s} must be < vocab_size={vocab_size}")


def _check_mask(attention_mask, idx: torch.Tensor, name: str = "idx") -> None:
    """``attention_mask``: a bool or 0/1 integer tensor of ``idx``'s shape and device (``name``: what messages
    call ``idx``), at least one real token per row (values checked on CPU tensors only, to avoid a device sync)."""
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a tensor or None; got {type(attention_mask).__name__}")
    if attention_mask.shape != idx.shape:
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)}; expected {name}'s shape {tuple(idx.shape)}"
        )
    if attention_mask.device != idx.device:
        raise ValueError(f"attention_mask is on {attention_mask.device} but {name} is on {idx.device}")
    if attention_mask.dtype != torch.bool and attention_mask.dtype not in _INT_DTYPES:
        raise ValueError(f"attention_mask must be bool or 0/1 integers; got dtype {attention_mask.dtype}")
    if attention_mask.device.type == "cpu":
        if attention_mask.dtype != torch.bool and ((attention_mask != 0) & (attention_mask != 1)).any():
            raise ValueError("attention_mask must hold only 0 and 1")
        if not attention_mask.bool().any(dim=1).all():
            raise ValueError("attention_mask has a row without any real token (all zeros)")


def check_attention_mask(attention_mask, check_values: bool) -> None:
    """A forward's ``attention_mask`` (shape checked by the caller): a tensor, and with ``check_values`` (eager;
    values are read on CPU tensors only, to avoid a device sync) only 0 (padding) and 1 (token). The eager
    forward and the fixed-shape static-cache step (``hf/cache_view.py``) both check here, so they refuse alike.

    Raises:
        TypeError: not a tensor. ValueError: (``check_values``) a value other than 0 and 1.
    """
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(
            f"attention_mask must be a torch.Tensor of 0/1 (or bool) or None; got {type(attention_mask).__name__}"
        )
    check_values = check_values and attention_mask.device.type == "cpu"
    if (
        check_values
        and attention_mask.dtype != torch.bool
        and not ((attention_mask == 0) | (attention_mask == 1)).all()
    ):
        raise ValueError("attention_mask must hold only 0 (padding) and 1 (token)")


def check_position_ids(position_ids, b: int, t: int, block_size: int, check_values: bool) -> torch.Tensor:
    """A forward's ``position_ids`` for ``b`` sequences of ``t`` new tokens: an integer tensor of shape ``(b, t)``,
    ``(1, t)`` (one row for every sequence, as ``transformers`` models broadcast it) or ``(t,)``; with
    ``check_values`` (eager; read on CPU tensors only) every position in ``[0, block_size)``. Returns it as
    ``(b, t)`` (``(1, t)`` expanded, a view) or ``(t,)``.

    Raises:
        TypeError: not a tensor. ValueError: another shape, a non-integer dtype, a position out of range.
    """
    if not isinstance(position_ids, torch.Tensor):
        raise TypeError(
            f"position_ids must be a torch.Tensor of integer positions or None; got {type(position_ids).__name__}"
        )
    if tuple(position_ids.shape) not in ((b, t), (1, t), (t,)):
        raise ValueError(
            f"position_ids must have shape ({b}, {t}), (1, {t}) or ({t},); got {tuple(position_ids.shape)}"
        )
    if position_ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"position_ids must hold integer positions (int64 or int32); got dtype {position_ids.dtype}")
    check_values = check_values and position_ids.device.type == "cpu"
    if check_values and (int(position_ids.min()) < 0 or int(position_ids.max()) >= block_size):
        raise ValueError(
            f"position_ids must be in [0, block_size={block_size}); got min {int(position_ids.min())}, "
            f"max {int(position_ids.max())}"
        )
    return position_ids.expand(b, t) if position_ids.dim() == 2 else position_ids


def check_checkpoint_kwargs(kwargs: dict) -> None:
    """Keyword arguments for ``torch.utils.checkpoint.checkpoint`` (``gradient_checkpointing_enable(
    gradient_checkpointing_kwargs=...)``): each must be one of its declared keyword-only parameters
    (``use_reentrant``, ``context_fn``, ``determinism_check``, ``debug``, ``early_stop``, read from its signature),
    a ``bool`` where one is declared (``None`` too where optional). Before, ``{"use_reentrant": "False"}`` ran the
    reentrant variant (a non-empty string is true) and a misspelt name was passed on to the checkpointed block.

    Raises:
        FlagError: a declared ``bool`` given something else. ValueError: an undeclared name, with the declared ones.
    """
    import inspect

    from torch.utils.checkpoint import checkpoint

    from coupled_qk.checks.values import FlagError

    declared = {p.name: p for p in inspect.signature(checkpoint).parameters.values() if p.kind is p.KEYWORD_ONLY}
    for name, value in kwargs.items():
        if name not in declared:
            raise ValueError(
                f"gradient_checkpointing_kwargs: {name!r} is not an argument of torch.utils.checkpoint.checkpoint "
                f"(it would be passed on to the checkpointed block); expected some of {sorted(declared)}"
            )
        annotation = str(declared[name].annotation).replace("Optional[bool]", "bool | None")
        if annotation in ("bool", "bool | None") and not (
            isinstance(value, bool) or (value is None and annotation == "bool | None")
        ):
            raise FlagError(f"gradient_checkpointing_kwargs: {name}={value!r} must be True or False")


# ---------------------------------------------------------------------------------------------------------------
# Tensors a diagnostic reads in float64: finite real values, matrices, probability maps and their tolerance
# (the attention diagnostics of coupled_qk.analysis)


def to_f64(x: torch.Tensor, name: str) -> torch.Tensor:
    """``x`` detached in float64; ``TypeError`` for a non-tensor or complex input, ``ValueError`` naming ``name``
    for non-finite entries."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    if x.is_complex():
        raise TypeError(f"{name} must be real; got complex dtype {x.dtype}")
    x64 = x.detach().to(torch.float64)
    if x64.numel() and not bool(torch.isfinite(x64).all()):
        raise ValueError(f"{name} must be finite; got nan/inf in a tensor of shape {tuple(x.shape)}")
    return x64


def check_matrix(x: torch.Tensor, name: str, what: str) -> None:
    """``ValueError`` naming ``name`` unless ``x`` has at least 2 dimensions, the last two non-empty."""
    if x.dim() < 2:
        raise ValueError(f"{name} must have at least 2 dimensions {what}; got shape {tuple(x.shape)} ({x.dim()}-D)")
    if x.shape[-2] < 1 or x.shape[-1] < 1:
        raise ValueError(f"{name} must have non-empty trailing dimensions {what}; got shape {tuple(x.shape)}")


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


def _default_atol(dtype: torch.dtype) -> float:
    return 1e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-4


def resolve_atol(atol: float | None, dtype: torch.dtype) -> float:
    """``atol``, checked ``>= 0``, or the default tolerance of ``dtype`` when ``None``."""
    if atol is None:
        return _default_atol(dtype)
    if not atol >= 0:
        raise ValueError(f"atol must be >= 0; got {atol}")
    return float(atol)

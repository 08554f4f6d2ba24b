"""The key/value cache of incremental decoding (docs/METHOD.md section 1: the cache stores evolved keys)."""

from __future__ import annotations

from typing import Protocol

import torch

from coupled_qk.checks.values import positive_int

__all__ = ["KVCache", "LayerCache", "StaticCache", "StaticKVCache"]


class LayerCache(Protocol):
    """What an attention layer calls on a cache: :class:`KVCache`, :class:`StaticKVCache` and the views of a
    ``transformers`` cache (:mod:`coupled_qk.hf.cache_view`). A layer also reads ``folds`` (the decoding folds,
    :mod:`coupled_qk.layers.folded`) and ``attn_mask()`` (the slots a query may see) where a cache has them."""

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``k (B, H_k, T, d)``, ``v (B, H_v, T, d_v)`` of ``layer_idx``; return the keys and values to
        attend to."""
        ...


class StaticCache(LayerCache, Protocol):
    """A fixed-shape cache (:class:`StaticKVCache`, :class:`coupled_qk.hf.cache_view.StaticStep`): the step's
    write slot ``position`` (``(1,)`` int64) and the mask of the slots each query may see."""

    @property
    def position(self) -> torch.Tensor:
        """``(1,)`` int64: the slot the next token is written to."""
        ...

    def attn_mask(self) -> torch.Tensor:
        """Boolean ``(B or 1, 1, 1, capacity)``: True at the slots a query may see."""
        ...


class KVCache:
    """Per-layer cache of the keys and values that attention scores against, preallocated.

    Each layer stores keys *after* the query-key map and RoPE (maps act per token, so cached decoding is
    exact) and values, in buffers of shape ``(B, H_k, capacity, d)`` allocated on the layer's first update
    (dtype and device of its keys); :meth:`update` writes the new positions in place and returns views of the
    filled part, so decoding copies nothing that grows with the prefix. A map with ``keys_per_query_head``
    caches one evolved key per query head (the evolved key depends on the query head's state), other layers
    the ``n_kv_heads``.

    Args:
        n_layer: number of layers (``>= 1``).
        capacity: positions to allocate (``GPT.new_cache`` uses ``block_size``); ``None`` grows the buffers
            by doubling when full (amortised constant cost per token).

    Under autograd (keys that require grad while grad mode is on) updates concatenate instead, so that no
    tensor saved for backward is overwritten in place.

    Raises:
        ValueError: a non-positive ``n_layer`` or ``capacity``, an update beyond a fixed ``capacity`` or whose
            batch, heads, width, dtype or device differ from the layer's cached tensors.
    """

    def __init__(self, n_layer: int, capacity: int | None = None):
        self.n_layer = positive_int("n_layer", n_layer)
        self.capacity = None if capacity is None else positive_int("capacity", capacity)
        self._k: list[torch.Tensor | None] = [None] * n_layer
        self._v: list[torch.Tensor | None] = [None] * n_layer
        self._len = [0] * n_layer
        self._held: list[tuple | None] = [None] * n_layer  # per layer: _signature of its buffers
        self.folds: dict = {}  # layer index -> the decoding fold used with this cache (layers/folded.py)

    @property
    def length(self) -> int:
        """Number of cached positions (0 when empty; the first layer's count)."""
        return self._len[0]

    @property
    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
        """Per layer ``(k, v)`` views of the cached positions ``(B, H_k, T_past, d)``, or ``None`` if empty."""
        return [
            None if k is None or v is None else (k[..., :n, :], v[..., :n, :])  # k and v are set together
            for k, v, n in zip(self._k, self._v, self._len)
        ]

    def nbytes(self) -> int:
        """Bytes held by the allocated buffers (all layers, keys and values, whole capacity)."""
        return sum(t.numel() * t.element_size() for t in self._k + self._v if t is not None)

    def crop(self, length: int) -> None:
        """Forget every position from ``length`` on (``0 <= length <= self.length``); buffers are kept."""
        if not 0 <= length <= self.length:
            raise ValueError(f"length={length} must be in [0, {self.length}] (the cached positions)")
        self._len = [min(n, length) for n in self._len]

    def _allocate(self, i: int, k: torch.Tensor, v: torch.Tensor, needed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """New buffers of layer ``i`` for ``needed`` positions, holding its cached ones; returns them."""
        old_k, old_v, n = self._k[i], self._v[i], self._len[i]
        if self.capacity is not None:
            if needed > self.capacity:
                raise ValueError(f"KVCache capacity={self.capacity} is full: {n} cached + {k.shape[-2]} new")
            cap = self.capacity
        else:
            cap = max(needed, 2 * (0 if old_k is None else old_k.shape[-2]), 16)
        new_k = k.new_empty(*k.shape[:-2], cap, k.shape[-1])
        new_v = v.new_empty(*v.shape[:-2], cap, v.shape[-1])
        if n and old_k is not None and old_v is not None:  # cached positions live in allocated buffers
            new_k[..., :n, :] = old_k[..., :n, :]
            new_v[..., :n, :] = old_v[..., :n, :]
        self._k[i], self._v[i] = new_k, new_v
        self._held[i] = self._signature(new_k, new_v)
        return new_k, new_v

    @staticmethod
    def _signature(k: torch.Tensor, v: torch.Tensor) -> tuple:
        """What :meth:`update` compares new keys and values with: their shapes but the time axis, keys' dtype and
        device."""
        return (k.shape[:-2], k.shape[-1], v.shape[:-2], v.shape[-1], k.dtype, k.device)

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``k (B, H_k, T, d)`` and ``v (B, H_v, T, d_v)`` for ``layer_idx``; return the cached
        ``(B, H_k, T_past + T, d)`` and ``(B, H_v, T_past + T, d_v)`` (views of the buffers)."""
        buf, vbuf, n = self._k[layer_idx], self._v[layer_idx], self._len[layer_idx]  # buffers: both or neither
        ks, vs = k.shape, v.shape
        end = n + ks[-2]
        # one comparison against what the buffers were allocated for (shapes read once: each read costs ~0.5 us)
        mismatch = buf is not None and (ks[:-2], ks[-1], vs[:-2], vs[-1], k.dtype, k.device) != self._held[layer_idx]
        if mismatch and n and buf is not None:
            raise ValueError(
                f"layer {layer_idx}: new keys {tuple(ks)} {k.dtype} on {k.device} do not match the cached "
                f"{tuple(buf.shape[:-2])} x T x {buf.shape[-1]} {buf.dtype} on {buf.device}"
            )
        if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
            if n and buf is not None and vbuf is not None:
                k = torch.cat([buf[..., :n, :], k], dim=-2)
                v = torch.cat([vbuf[..., :n, :], v], dim=-2)
            self._k[layer_idx], self._v[layer_idx], self._len[layer_idx] = k, v, end
            self._held[layer_idx] = self._signature(k, v)
            return k, v
        if buf is None or vbuf is None or mismatch or end > buf.shape[-2]:
            buf, vbuf = self._allocate(layer_idx, k, v, end)
        buf[..., n:end, :] = k
        vbuf[..., n:end, :] = v
        self._len[layer_idx] = end
        return buf[..., :end, :], vbuf[..., :end, :]


class StaticKVCache:
    """Fixed-shape decoding cache for one compiled single-token step: the buffers never change shape and the
    write position is a tensor, so one compiled graph (and, on CUDA, one CUDA graph) serves every step.

    It wraps the preallocated buffers of a :class:`KVCache` after an (eager) prefill
    (:meth:`from_cache`): per layer keys ``(B, H_k, capacity, d)`` and values ``(B, H_v, capacity, d_v)``.
    :meth:`update` writes the new token's key and value at slot ``position`` in place (``index_copy_``) and
    returns the whole buffers; attention then masks the slots after ``position`` with :meth:`attn_mask`
    (the unwritten slots are zeroed by :meth:`from_cache`: a masked slot has probability 0, but ``0 * NaN`` from
    uninitialised memory would still poison the output). Mathematically the
    step equals a :class:`KVCache` step (same keys, same softmax over the filled slots); it is checked token
    for token against eager decoding in ``tests/models/test_compile.py``.

    Padded batches (prompts of different lengths, left-padded): ``key_mask (B, position)`` marks the prompt's
    real tokens (1) and padding (0); the slots after the prompt are the generated tokens, all real. Attention
    then also hides each row's padding, and :attr:`positions` ``(B, 1)`` numbers each row's real tokens (the
    next token's position; advanced with :attr:`position`), as ``GPT.forward`` with an ``attention_mask`` does.

    :attr:`next_slot` is :attr:`position` as a Python int, which :meth:`advance` keeps equal (a check before a
    step costs no device read); when it reaches ``capacity`` the cache is full.

    Args:
        keys, values: one buffer per layer (equal batch, capacity, device); position: the slot of the next
            token (``0 <= position < capacity``); key_mask: ``None`` (no padding) or ``(B, position)`` 0/1 or bool.

    Raises:
        ValueError: empty or unequal lists, buffers of different capacity, a position outside the buffers, a
            ``key_mask`` of another shape or with a row without real tokens.
    """

    def __init__(
        self, keys: list[torch.Tensor], values: list[torch.Tensor], position: int, key_mask: torch.Tensor | None = None
    ):
        if not keys or len(keys) != len(values):
            raise ValueError(f"need one key and one value buffer per layer; got {len(keys)} and {len(values)}")
        capacity = keys[0].shape[-2]
        if any(t.shape[-2] != capacity for t in keys + values):
            raise ValueError(f"every buffer must have capacity {capacity}; got {[t.shape[-2] for t in keys + values]}")
        if not 0 <= position < capacity:
            raise ValueError(f"position={position} must be in [0, capacity={capacity})")
        self.k, self.v = list(keys), list(values)
        self.capacity = capacity
        self.position = torch.tensor([position], dtype=torch.long, device=keys[0].device)
        self.next_slot = position  # the same on the host (no device read), moved by advance()
        self.slots = torch.arange(capacity, device=keys[0].device)
        self.key_mask = self.positions = None
        if key_mask is not None:
            batch = keys[0].shape[0]
            if tuple(key_mask.shape) != (batch, position):
                raise ValueError(
                    f"key_mask must have shape (B, position) = ({batch}, {position}); got {tuple(key_mask.shape)}"
                )
            real = key_mask.to(device=keys[0].device).bool()
            if not bool(real.any(-1).all()):
                raise ValueError("key_mask has a row without real tokens (all padding)")
            self.key_mask = torch.ones(batch, capacity, dtype=torch.bool, device=real.device)
            self.key_mask[:, :position] = real
            self.positions = real.long().sum(-1, keepdim=True)  # the next token's position in each row

    @classmethod
    def from_cache(cls, cache: KVCache, key_mask: torch.Tensor | None = None) -> StaticKVCache:
        """The buffers of ``cache`` (every layer filled to ``cache.length``, fixed ``capacity``), writing next
        at ``cache.length``. The buffers are shared, not copied; their unfilled slots are zeroed. ``key_mask``:
        the prompt's ``attention_mask (B, cache.length)`` of a padded batch (see the class).

        Raises:
            ValueError: ``cache`` has no fixed capacity, an empty layer, layers of unequal length, or no free slot.
        """
        if cache.capacity is None:
            raise ValueError("a StaticKVCache needs a KVCache with a fixed capacity (GPT.new_cache(capacity))")
        keys = [k for k in cache._k if k is not None]
        values = [v for v in cache._v if v is not None]
        if len(keys) != cache.n_layer or len(set(cache._len)) != 1:
            raise ValueError(f"every layer of the cache must be filled to the same length; got {cache._len}")
        if any(k.shape[-2] != cache.capacity for k in keys):
            raise ValueError("the cache's buffers are not preallocated (it was filled under autograd)")
        for t in keys + values:  # masked slots get probability 0, but 0 * NaN garbage would still be NaN
            t[..., cache.length :, :].zero_()
        return cls(keys, values, cache.length, key_mask)

    @property
    def length(self) -> int:
        """Filled slots (a device-to-host read of :attr:`position`; not for use inside a compiled step)."""
        return int(self.position)

    def advance(self) -> None:
        """Move the write position (and each row's position) one slot on (after a step); :attr:`next_slot` too."""
        self.position += 1
        self.next_slot += 1
        if self.positions is not None:
            self.positions += 1

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k (B, H_k, 1, d)`` and ``v (B, H_v, 1, d_v)`` at slot :attr:`position` of ``layer_idx``;
        return the whole buffers ``(B, H_k, capacity, d)`` and ``(B, H_v, capacity, d_v)``."""
        kb, vb = self.k[layer_idx], self.v[layer_idx]
        kb.index_copy_(2, self.position, k.to(kb.dtype))
        vb.index_copy_(2, self.position, v.to(vb.dtype))
        return kb, vb

    def attn_mask(self) -> torch.Tensor:
        """Boolean ``(1, 1, 1, capacity)``: True at the filled slots ``0..position`` (the step's own included);
        ``(B, 1, 1, capacity)`` with a ``key_mask``, False at each row's padding too."""
        filled = self.slots <= self.position
        if self.key_mask is not None:
            return (filled & self.key_mask)[:, None, None, :]
        return filled.view(1, 1, 1, -1)

""":class:`CacheView`: the :class:`coupled_qk.KVCache` interface over a ``transformers`` cache, so that the
wrapped ``GPT`` of :mod:`coupled_qk.hf.modeling` reads and extends the cache ``generate`` owns."""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, StaticLayer

from coupled_qk.checks.tensors import check_attention_mask, check_position_ids

LARGER = (
    "Create it with a larger max_cache_len (generate(..., cache_implementation='static', max_cache_len=N) sizes "
    "the cache it creates, e.g. to continue generating from the cache it returns)"
)


class CacheView:
    """The :class:`coupled_qk.KVCache` interface (``length``, ``update(layer_idx, k, v)``) over a
    ``transformers`` :class:`~transformers.cache_utils.Cache` (e.g. ``DynamicCache``), so ``GPT`` can read
    and extend a cache that ``generate`` owns (beam search reordering, cropping, ... keep working).

    Static caches (``StaticCache``, ``generate(..., cache_implementation="static")``; any cache with
    ``is_compileable``) preallocate ``max_cache_len`` positions and lay keys and values out with the *same*
    number of heads, while our keys may have more heads than the values (coupled keys are stored one per query
    head; differential values are grouped per head pair). The view then stores each value head repeated
    ``r = H_k / H_v`` times (``r`` times the value memory, nothing else changes) and returns the filled
    positions only, keys ``(B, H_k, T_past + T, d)`` and the original values ``(B, H_v, T_past + T, d_v)``
    (a strided view of the repeated ones), so attention sees exactly what a ``DynamicCache`` gives it.
    """

    def __init__(self, cache: Cache):
        self.cache = cache
        self.static = bool(getattr(cache, "is_compileable", False))

    @property
    def length(self) -> int:
        """Number of cached positions."""
        return int(self.cache.get_seq_length())

    @property
    def folds(self) -> dict:
        """The decoding folds used with this cache (:mod:`coupled_qk.layers.folded`), kept on the wrapped
        ``transformers`` cache so that they last across the views ``generate`` makes each step."""
        folds = getattr(self.cache, "_coupled_qk_folds", None)
        if folds is None:
            folds = self.cache._coupled_qk_folds = {}
        return folds

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``k (B, H_k, T_new, d)``, ``v (B, H_v, T_new, d_v)`` for ``layer_idx``; return the cached
        tensors of all positions so far.

        Raises:
            ValueError: a static cache too short for the new positions (naming ``max_cache_len``).
        """
        if not self.static:
            return self.cache.update(k, v, layer_idx)
        past = int(self.cache.get_seq_length(layer_idx))
        size = self.cache.get_max_length(layer_idx)
        if size is not None and 0 <= size < past + k.shape[-2]:
            raise ValueError(
                f"the static cache holds max_cache_len={size} positions; {past} are cached and "
                f"{k.shape[-2]} more were given. {LARGER}"
            )
        r = k.shape[1] // v.shape[1]
        keys, values = self.cache.update(k, v.repeat_interleave(r, dim=1) if r > 1 else v, layer_idx)
        n = past + k.shape[-2]
        return keys[:, :, :n], values[:, ::r, :n]


def static_layers(cache) -> list | None:
    """The layers of ``cache`` when it is a ``transformers`` static cache whose every layer is a plain, filled
    ``StaticLayer`` (the layout :class:`StaticStep` reads), else ``None``."""
    layers = getattr(cache, "layers", None)
    if not getattr(cache, "is_compileable", False) or not layers:
        return None
    plain = all(type(layer) is StaticLayer and layer.is_initialized for layer in layers)
    return layers if plain else None


class StaticStep:
    """One single-token decoding step over a ``transformers`` static cache with fixed shapes, so that
    ``torch.compile`` of the forward (what ``generate(..., cache_implementation="static")`` compiles on GPU)
    traces it as **one graph** that never recompiles: nothing here reads the number of cached positions as a
    Python number. The interface is that of :class:`coupled_qk.layers.kv_cache.StaticKVCache` (``position``,
    ``update``, ``attn_mask``), which :meth:`coupled_qk.GPT.static_hidden_states` runs on.

    - ``position``: ``(1,)`` int64, the slot of the new token (the cache's ``cumulative_length`` before this step).
    - ``update(layer_idx, k, v)`` writes ``k (B, H_k, 1, d)`` and ``v (B, H_v, 1, d_v)`` there through the
      cache's own ``update`` (each value head repeated ``H_k / H_v`` times, as :class:`CacheView` stores them)
      and returns the whole buffers: keys ``(B, H_k, max_cache_len, d)``, values ``(B, H_v, max_cache_len, d_v)``
      (a strided view of the repeated ones).
    - ``attn_mask()``: bool ``(B or 1, 1, 1, max_cache_len)``, True at the filled slots ``0..position`` that are
      real tokens (``attention_mask``), and always at the token's own slot.
    - ``positions``: ``(B, 1)`` positions of the new tokens: ``position_ids`` when given, else the number of real
      tokens before each (``attention_mask``), else ``position``.

    Args:
        cache: a static cache whose layers :func:`static_layers` accepts.
        attention_mask: ``(B, max_cache_len)`` (what ``create_masks_for_generate`` gives ``generate``'s decoding
            steps: zeros after the new token) or ``(B, T_past + 1)``, 0/1 or bool; ``None``: no padding.
        position_ids: ``(B, 1)``, ``(1, 1)`` or ``(1,)`` integers, or ``None``.
        block_size: the model's context length (positions must stay below it).

    Raises:
        TypeError: a mask or ``position_ids`` that is not a tensor. ValueError: a mask or ``position_ids`` of
            another shape, non-integer ``position_ids``; (outside a compiled region, where the numbers are read;
            values on CPU only) no free slot, mask values other than 0 and 1, positions outside ``[0, block_size)``.
    """

    folds = property(
        lambda self: CacheView(self.cache).folds,
        doc="The decoding folds kept on the wrapped cache (:attr:`CacheView.folds`): the eager step folds the map as "
        ":class:`CacheView` does.",
    )

    def __init__(
        self,
        cache: Cache,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        batch: int,
        block_size: int,
    ):
        self.cache = cache
        first = cache.layers[0]
        size = first.max_cache_len
        self.position = first.cumulative_length.reshape(1).clone()  # the cache advances it in update
        slots = torch.arange(size, device=self.position.device)
        filled, own = slots <= self.position, slots == self.position
        eager = not torch.compiler.is_compiling()
        past = int(self.position) if eager else None
        if eager and past >= size:
            raise ValueError(
                f"the static cache holds max_cache_len={size} positions; {past} are cached and 1 more "
                f"was given. {LARGER}"
            )
        mask = filled.view(1, size)
        if attention_mask is not None:
            check_attention_mask(attention_mask, eager)  # as the eager forward checks it
            width = attention_mask.shape[-1]
            if (
                attention_mask.dim() != 2
                or attention_mask.shape[0] != batch
                or (width != size and (width > size or (eager and width != past + 1)))
            ):
                raise ValueError(
                    f"attention_mask must have shape (B, T_past + 1) = ({batch}, "
                    f"{past + 1 if eager else 'T_past + 1'}) "
                    f"or (B, max_cache_len) = ({batch}, {size}) for a decoding step over a static "
                    f"cache; got {tuple(attention_mask.shape)}"
                )
            keys = torch.nn.functional.pad(attention_mask.bool(), (0, size - width))
            mask = (keys & filled) | own
        self._mask = mask[:, None, None, :]
        if position_ids is not None:  # checked as the eager forward checks them
            positions = check_position_ids(position_ids, batch, 1, block_size, eager).reshape(-1, 1)
        elif attention_mask is not None:
            positions = (mask.long().sum(-1, keepdim=True) - 1).clamp(min=0)
        else:
            positions = self.position.view(1, 1)
        if (
            eager
            and positions.device.type == "cpu"
            and not 0 <= int(positions.min()) <= int(positions.max()) < block_size
        ):
            raise ValueError(
                f"position_ids must be in [0, block_size={block_size}); the step's position is {int(positions.max())}"
            )
        self.positions = positions.expand(batch, 1)

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new token's ``k``, ``v`` of ``layer_idx`` at :attr:`position`; the whole buffers (see the
        class)."""
        r = k.shape[1] // v.shape[1]
        keys, values = self.cache.update(k, v.repeat_interleave(r, dim=1) if r > 1 else v, layer_idx)
        return keys, values[:, ::r]

    def attn_mask(self) -> torch.Tensor:
        """The slots the new token may attend to, bool ``(B or 1, 1, 1, max_cache_len)`` (see the class)."""
        return self._mask

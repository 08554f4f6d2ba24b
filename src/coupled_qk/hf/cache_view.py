""":class:`CacheView`: the :class:`coupled_qk.KVCache` interface over a ``transformers`` cache, so that the
wrapped ``GPT`` of :mod:`coupled_qk.hf.modeling` reads and extends the cache ``generate`` owns."""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache


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
            raise ValueError(f"the static cache holds max_cache_len={size} positions; {past} are cached and "
                             f"{k.shape[-2]} more were given. Create it with a larger max_cache_len")
        r = k.shape[1] // v.shape[1]
        keys, values = self.cache.update(k, v.repeat_interleave(r, dim=1) if r > 1 else v, layer_idx)
        n = past + k.shape[-2]
        return keys[:, :, :n], values[:, ::r, :n]

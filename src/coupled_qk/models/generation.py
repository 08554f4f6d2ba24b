"""Text generation for :class:`~coupled_qk.models.gpt.GPT`: sampling with or without the KV cache, past the
context (a sliding window), and with a compiled single-token step (:class:`GPTGenerationMixin`); the sampling rule
(:func:`sample_next_token`) and the compiled cache's capacity (:func:`static_capacity`).

The mixin holds no state: it reads the model's ``config`` and calls its ``new_cache``, ``embed``, forward and
``compiled_decode_step`` (defined in :mod:`coupled_qk.models.gpt`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn as nn

from coupled_qk.checks.tensors import GREEDY_BELOW, check_generate_args, check_greedy_extras
from coupled_qk.checks.values import declared_flags
from coupled_qk.layers.kv_cache import KVCache, LayerCache, StaticKVCache

if TYPE_CHECKING:
    from coupled_qk.models.compiled import DecodeStep
    from coupled_qk.models.config import GPTConfig


class GPTGenerationMixin:
    """:meth:`generate`, :meth:`generate_sliding` and :meth:`next_token_logits` of :class:`~coupled_qk.GPT`."""

    config: GPTConfig  # the model's (GPT.__init__)
    ln_f: nn.LayerNorm

    if TYPE_CHECKING:  # the model's methods these call (GPT, GPTCompileMixin)

        def __call__(
            self,
            idx: torch.Tensor,
            cache: KVCache | None = None,
            attention_mask: torch.Tensor | None = None,
            position_ids: torch.Tensor | None = None,
        ) -> torch.Tensor: ...

        def new_cache(self, capacity: int | None = None) -> KVCache: ...

        def embed(
            self,
            idx: torch.Tensor,
            cache: KVCache | None = None,
            key_mask: torch.Tensor | None = None,
            position_ids: torch.Tensor | None = None,
            check_ids: bool = True,
        ) -> tuple[torch.Tensor, tuple | None]: ...

        def _run_blocks(
            self,
            x: torch.Tensor,
            rope: Sequence[torch.Tensor] | None,
            cache: LayerCache | None,
            key_mask: torch.Tensor | None = None,
        ) -> torch.Tensor: ...

        def logits(self, hidden: torch.Tensor) -> torch.Tensor: ...

        def compiled_decode_step(self) -> DecodeStep: ...

    @torch.no_grad()
    @declared_flags
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
        attention_mask: torch.Tensor | None = None,
        context: str = "slide",
        compile: bool = False,
    ) -> torch.Tensor:
        """Sample ``max_new_tokens`` tokens after the prompt ``idx (B, T)``; returns ``(B, T + max_new_tokens)``.

        ``temperature = 0`` decodes greedily; the default ``1.0`` samples from the model's own distribution
        (as Hugging Face ``generate``; the ``coupled-qk generate`` command uses the same default). With
        ``use_cache`` the prompt is encoded once and each new token reuses the :class:`KVCache` (every
        variant; exact because the dynamics act per token). ``attention_mask (B, T)`` (0 at padding) lets
        prompts of different lengths share a batch, padded on the left: each row then generates what its
        prompt generates alone (positions count real tokens). A right-padded mask is refused
        (:func:`~coupled_qk.checks.tensors.check_left_padded`): each row continues after its last position.

        ``context`` decides what happens when prompt plus new tokens exceed ``block_size``: ``"slide"``
        (default, as nanoGPT's ``sample.py`` and a sliding window in Hugging Face) predicts each token from the
        last ``block_size`` tokens (see :meth:`generate_sliding`); ``"error"`` raises instead.

        ``compile=True``: an eager prefill, then every new token through one compiled single-token step over a
        preallocated :class:`~coupled_qk.layers.kv_cache.StaticKVCache` (:meth:`compiled_decode_step`; built
        once and kept on the model, so later calls do not recompile); the same tokens as eager decoding up to
        float rounding, padded batches (``attention_mask``) included. Within the context only: with
        ``context="slide"`` the tokens that still fit it use the compiled step and those past it decode eagerly
        (see :meth:`generate_sliding`).

        Raises:
            TypeError, ValueError: from :func:`coupled_qk.checks.tensors.check_generate_args`, naming the
                argument: negative or non-int ``max_new_tokens``, negative or non-finite ``temperature``,
                ``top_k < 1``, an empty prompt or batch, ids out of the vocabulary, a mask of another shape, or
                (``context="error"``) a total length beyond ``block_size`` (no silent cropping); ``context``
                other than ``"slide"``/``"error"``; ``compile=True`` without ``use_cache``; ``top_k`` or
                ``generator`` with a greedy ``temperature`` (``0``), where they would
                change no token (:func:`coupled_qk.checks.tensors.check_greedy_extras`).
        """
        if context not in ("slide", "error"):
            raise ValueError(f"context={context!r} must be 'slide' or 'error'")
        check_generate_args(
            idx,
            max_new_tokens,
            block_size=self.config.block_size,
            vocab_size=self.config.vocab_size,
            temperature=temperature,
            top_k=top_k,
            use_cache=use_cache,
            generator=generator,
            attention_mask=attention_mask,
            fit_context=context == "error",
        )  # once per call
        check_greedy_extras(temperature, top_k, generator)
        if compile and not use_cache:
            raise ValueError("generate(compile=True) decodes with the cache: use_cache must be True (got False)")
        total = idx.shape[1] + max_new_tokens
        if total > self.config.block_size:  # context="slide" (checked above): predict from the last block_size
            return self.generate_sliding(
                idx, max_new_tokens, temperature, top_k, use_cache, generator, attention_mask, compile=compile
            )
        if compile:
            return self._generate_compiled(idx, max_new_tokens, temperature, top_k, generator, attention_mask)
        return self._generate_eager(idx, max_new_tokens, temperature, top_k, use_cache, generator, attention_mask)

    def _generate_eager(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float,
        top_k: int | None,
        use_cache: bool,
        generator: torch.Generator | None,
        attention_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """:meth:`generate` within the context, eagerly (arguments checked there): ``(B, T + max_new_tokens)``."""
        total = idx.shape[1] + max_new_tokens
        cache = self.new_cache(max(total, 1)) if use_cache else None
        b, t = idx.shape
        out = idx.new_empty(b, total)
        out[:, :t] = idx
        step_input, mask = idx, attention_mask
        for i in range(max_new_tokens):
            if mask is not None and i:
                mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
            inputs = step_input if use_cache else out[:, : t + i]
            if mask is None:
                logits = self.next_token_logits(inputs, cache).float()
            else:
                logits = self(inputs, cache, mask)[:, -1, :].float()
            nxt = sample_next_token(logits, temperature, top_k, generator)
            out[:, t + i : t + i + 1] = nxt
            step_input = nxt
        return out

    @torch.no_grad()
    @declared_flags
    def generate_sliding(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
        attention_mask: torch.Tensor | None = None,
        compile: bool = False,
    ) -> torch.Tensor:
        """:meth:`generate` past the context: each new token is predicted from the last ``block_size`` tokens.

        Exactly what re-running the model on ``out[:, -block_size:]`` before each token gives (nanoGPT's
        ``idx[:, -block_size:]`` crop): positions restart at 0 at the window's first token. While prompt plus
        generated tokens fit the context, decoding is :meth:`generate` (with the :class:`KVCache` if
        ``use_cache``); after that the window moves by one token per step and the cache is rebuilt from the
        window at every step (a rolled cache would keep keys computed at their old positions, which learned
        positions and the query-key maps do not allow), so each token beyond the context costs one forward
        pass over ``block_size`` tokens. A prompt longer than ``block_size`` is read through its last
        ``block_size`` tokens; the output still starts with the whole prompt. ``attention_mask (B, T)`` (left
        padding) is cropped with the window, so each row still generates what its prompt generates alone.
        ``compile=True``: the tokens that fit the context go through the compiled step (:meth:`generate` with
        ``compile=True``); those past it decode eagerly.

        Args and returns as :meth:`generate`: ``(B, T + max_new_tokens)`` token ids.

        Raises:
            TypeError, ValueError: as :meth:`generate` (:func:`coupled_qk.checks.tensors.check_generate_args`).
        """
        check_generate_args(
            idx,
            max_new_tokens,
            block_size=self.config.block_size,
            vocab_size=self.config.vocab_size,
            temperature=temperature,
            top_k=top_k,
            use_cache=use_cache,
            generator=generator,
            attention_mask=attention_mask,
            fit_context=False,
        )
        check_greedy_extras(temperature, top_k, generator)
        block = self.config.block_size
        b, t = idx.shape
        first = min(max_new_tokens, max(block - t, 0))  # tokens that still fit the context: plain decoding
        out = (
            self.generate(
                idx, first, temperature, top_k, use_cache, generator, attention_mask, context="error", compile=compile
            )
            if first
            else idx
        )
        mask = attention_mask
        if mask is not None and first:
            mask = torch.cat([mask, mask.new_ones(b, first)], dim=1)
        out = torch.cat([out, out.new_empty(b, max_new_tokens - first)], dim=1)
        for i in range(t + first, t + max_new_tokens):
            window = out[:, i - block : i] if i > block else out[:, :i]
            if mask is None:
                logits = self.next_token_logits(window, None).float()
            else:
                mask = torch.cat([mask, mask.new_ones(b, 1)], dim=1) if mask.shape[1] < i else mask
                logits = self(window, None, mask[:, i - window.shape[1] : i])[:, -1, :].float()
            out[:, i : i + 1] = sample_next_token(logits, temperature, top_k, generator)
        return out

    def _generate_compiled(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float,
        top_k: int | None,
        generator: torch.Generator | None,
        attention_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """:meth:`generate` with ``compile=True`` (arguments checked there)."""
        b, t = idx.shape
        total = t + max_new_tokens
        out = idx.new_empty(b, total)
        out[:, :t] = idx
        if max_new_tokens == 0:
            return out
        cache = self.new_cache(static_capacity(total, self.config.block_size))
        if attention_mask is None:  # the prefill, eager
            logits = self.next_token_logits(idx, cache).float()
        else:
            logits = self(idx, cache, attention_mask)[:, -1, :].float()
        static = StaticKVCache.from_cache(cache, attention_mask)
        step = self.compiled_decode_step()
        for i in range(max_new_tokens):
            nxt = sample_next_token(logits, temperature, top_k, generator)
            out[:, t + i : t + i + 1] = nxt
            if i + 1 < max_new_tokens:
                logits = step(nxt, static).float()
                static.advance()
        return out

    def next_token_logits(self, idx: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        """Logits ``(B, vocab)`` of the last position of ``idx (B, T)``: one decoding step of :meth:`generate`.

        The output head runs on the last position only and the token ids are not range-checked (a per-token
        reduction; check them once, as :meth:`generate` does); shapes and lengths are checked as in
        :meth:`forward`. ``cache`` is read and extended as in :meth:`forward`.
        """
        x, rope = self.embed(idx, cache, check_ids=False)
        x = self._run_blocks(x, rope, cache)
        return self.logits(self.ln_f(x[:, -1]))


def sample_next_token(
    logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One token per row from float logits ``(B, vocab)`` -> ids ``(B, 1)``: the arg-max at ``temperature = 0``,
    else a draw from ``softmax(logits / temperature)`` restricted to the ``top_k`` largest logits (ties at the
    k-th value kept). Used by :meth:`GPT.generate` and :meth:`GPT.generate_sliding`. A temperature so small
    that it underflows in the logits' dtype decodes greedily (its limit); the logits are shifted by their
    maximum first, so a tiny temperature cannot overflow to ``inf - inf = nan``."""
    if temperature < max(torch.finfo(logits.dtype).tiny, GREEDY_BELOW):
        return logits.argmax(dim=-1, keepdim=True)
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)


def static_capacity(total: int, block_size: int, minimum: int = 64) -> int:
    """Cache capacity for a compiled decode of ``total`` positions: the next power of two ``>= total`` (at least
    ``minimum``), at most ``block_size``; a few capacities (hence compiled graphs) serve every length.

    Raises:
        ValueError: ``total`` outside ``[1, block_size]``.
    """
    if not 1 <= total <= block_size:
        raise ValueError(f"total={total} positions must be in [1, block_size={block_size}]")
    return min(block_size, max(minimum, 1 << (total - 1).bit_length()))

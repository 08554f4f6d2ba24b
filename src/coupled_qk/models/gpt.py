"""A GPT-style decoder (pre-norm blocks, tied embeddings, GPT-2 init) with any attention variant.

Architecture after nanoGPT / GPT-2 (Radford et al. 2019): token embedding (+ learned positions, or RoPE in
attention), ``n_layer`` blocks ``x + Attn(LN(x))``, ``x + MLP(LN(x))``, final LayerNorm, output head tied
to the token embedding. Text generation (``generate``, ``generate_sliding``, ``next_token_logits``) is in
:mod:`coupled_qk.models.generation`, a mixin of :class:`GPT`; the compiled path (regional compilation, the
compiled decoding step) in :mod:`coupled_qk.models.compiled`, another.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from coupled_qk.checks.tensors import check_attention_mask, check_position_ids
from coupled_qk.layers.attention import LEGACY_STATE_KEYS, AttentionRecord, CausalSelfAttention
from coupled_qk.layers.kv_cache import KVCache, LayerCache
from coupled_qk.models.compiled import GPTCompileMixin
from coupled_qk.models.config import GPTConfig
from coupled_qk.models.decode_head import DecodingHeadMixin
from coupled_qk.models.generation import GPTGenerationMixin
from coupled_qk.models.registry import get_attention
from coupled_qk.ops.losses import next_token_loss
from coupled_qk.ops.rope import rope_tables, signed_sin


def current_state_key(key: str) -> str:
    """Today's name of a :class:`GPT` state-dict (or optimizer-state) key written in an earlier layout of the
    attention layer (``blocks.<i>.attn.<old>``, :data:`~coupled_qk.layers.attention.LEGACY_STATE_KEYS`: e.g.
    ``blocks.0.attn.lambda_q1`` -> ``blocks.0.attn.scorer.lambda_q1``); other keys unchanged."""
    head, sep, name = key.partition(".attn.")
    for old, new in LEGACY_STATE_KEYS if sep else ():
        if name == old or (old.endswith(".") and name.startswith(old)):
            return head + sep + new + name[len(old) :]
    return key


class MLP(nn.Module):
    """Feed-forward sub-layer ``W2 gelu(W1 x)``, bias-free; ``(B, T, d_model) -> (B, T, d_model)``."""

    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__()
        self.fc = nn.Linear(d_model, d_ff, bias=False)
        self.out_proj = nn.Linear(d_ff, d_model, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``dropout(W2 gelu(W1 x))`` (the exact, erf GELU of ``F.gelu``, as nanoGPT): ``x (B, T, d_model)`` -> the
        same shape and dtype (any leading dimensions work). Unchecked: :class:`GPT` checks its inputs at its entry."""
        return self.dropout(self.out_proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block; ``(B, T, d_model) -> (B, T, d_model)``."""

    def __init__(self, config: GPTConfig, layer_idx: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model)
        n_kv_heads, d_head = config.n_kv_heads, config.d_head
        assert n_kv_heads is not None and d_head is not None, "GPTConfig derives n_kv_heads and d_head, never None"
        self.attn = CausalSelfAttention(
            config.d_model,
            config.n_heads,
            n_kv_heads,
            d_head,
            **get_attention(config.attention).layer_kwargs(config.qk_map),
            layer_idx=layer_idx,
            map_position=config.map_position,
            use_rope=config.position == "rope",
            dropout=config.dropout,
            impl=config.attn_impl,
        )
        self.attn.check_every_call = False  # GPT checks ids, masks and positions at its entry
        self.resid_dropout = nn.Dropout(config.dropout)
        self.ln_2 = nn.LayerNorm(config.d_model) if config.use_mlp else None
        assert config.d_ff is not None, "GPTConfig derives d_ff (4 d_model) when not given"
        self.mlp = MLP(config.d_model, config.d_ff, config.dropout) if config.use_mlp else None

    def forward(
        self,
        x: torch.Tensor,
        rope: Sequence[torch.Tensor] | None = None,
        cache: LayerCache | None = None,
        record: bool = False,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, AttentionRecord | None]:
        """``x (B, T, d_model)`` -> same shape; with ``record`` returns ``(x, AttentionRecord)``; ``key_mask``
        ``(B, T_past + T)`` bool, False at padding."""
        a = self.attn(self.ln_1(x), rope, cache, record=record, key_mask=key_mask)
        rec = None
        if record:
            a, rec = a
        x = x + self.resid_dropout(a)
        if self.mlp is not None and self.ln_2 is not None:  # both or neither (use_mlp)
            x = x + self.mlp(self.ln_2(x))
        return (x, rec) if record else x


@dataclass
class BlockTrace:
    """One block of :meth:`GPT.trace`: its input and output ``(B, T, d_model)`` and its attention record."""

    layer: int
    input: torch.Tensor
    output: torch.Tensor
    record: AttentionRecord


# GPT.compile (GPTCompileMixin) is regional compilation with torch.compile's named arguments, returning the model:
# its public API, deliberately unlike nn.Module.compile(*args, **kwargs) -> None, which it replaces.
class GPT(GPTCompileMixin, GPTGenerationMixin, DecodingHeadMixin, nn.Module):  # type: ignore[misc]
    """GPT language model with a selectable attention variant.

    ``model(idx)`` maps token ids ``idx`` (LongTensor ``(B, T)``, ``T <= block_size``) to logits
    ``(B, T, vocab_size)`` in the parameters' dtype. Pass a :class:`KVCache` (``model.new_cache()``) to
    decode incrementally; positions continue from the cache length. ``model.gradient_checkpointing = True``
    (with ``model.checkpoint_every = n``: every ``n``-th block only, from block 0)
    recomputes each block's activations in the backward pass of a training forward without a cache
    (activation checkpointing, ``torch.utils.checkpoint``; same values and gradients, less memory).

    Raises:
        ValueError: ``idx`` not 2-D integer, ids outside ``[0, vocab_size)``, or a sequence (plus cached
            positions) longer than ``block_size``.

    Source: nanoGPT/GPT-2 architecture and init (std 0.02, residual projections scaled by
    ``1/sqrt(2 n_layer)``); attention variants from :mod:`coupled_qk.layers.attention`.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig; got {type(config).__name__}")
        self.config = config
        n_rows = config.padded_vocab_size  # vocab_size, or rounded up (GPTConfig.vocab_pad_multiple)
        self.tok_emb = nn.Embedding(n_rows, config.d_model)
        self.pos_emb = nn.Embedding(config.block_size, config.d_model) if config.position == "learned" else None
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, n_rows, bias=False)
        self.lm_head.weight = self.tok_emb.weight
        self._rope: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # (cos, sin, signed sin)
        self._compile_state = None  # None (eager), "pending" (first call not yet made), "ok", "failed"
        self.compile_info = {}
        self._decode_step = None  # the compiled single-token step of generate(compile=True), built once
        self._decode_settings = None  # the arguments it was compiled with (compiled_decode_step)
        # activation checkpointing (transformers' attribute names, set by gradient_checkpointing_enable()): while
        # training without a cache, each block's activations are recomputed in the backward pass instead of stored
        self.gradient_checkpointing = False
        self._gradient_checkpointing_func = None
        self.checkpoint_every = 1  # checkpoint blocks 0, n, 2n, ... only (transformers' every_n_layers)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("out_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        if n_rows > config.vocab_size:
            with torch.no_grad():
                self.tok_emb.weight[config.vocab_size :].zero_()  # padding rows: never read, never scored
        self._build_rope()

    def _build_rope(self) -> None:
        """Build the RoPE tables on the parameters' device now (not on first use: a table added to ``_rope``
        inside a compiled call changes the guarded dict and recompiles the whole graph on the second call).
        Nothing is built on the meta device (the tables are made on first use after materialisation)."""
        self._rope = {}
        device = self.tok_emb.weight.device
        if self.pos_emb is None and device.type != "meta":
            self._rope_tables(device)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> GPT:
        """``.to()``, ``.cuda()``, ``.to_empty()``...: move the parameters, then rebuild the RoPE tables there."""
        out = super()._apply(fn, recurse)
        self._build_rope()
        return out

    def __getstate__(self) -> dict[str, Any]:
        """Pickling and ``copy.deepcopy`` leave the compiled decoding step behind (rebuilt when needed)."""
        return {**super().__getstate__(), "_decode_step": None, "_head_t": None, "_head_key": None}

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def rope_tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE ``(cos, sin)`` tables ``(block_size, d_head)`` in float32 on ``device`` (computed once per device,
        at construction and after every move of the parameters; not buffers, so meta-device construction and
        ``from_pretrained`` never see stale values)."""
        return self._rope_tables(device)[:2]

    def _rope_tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(cos, sin, signed_sin(sin))`` on ``device``: the two tables and the third one that makes the
        rotation one ``addcmul`` (:func:`coupled_qk.ops.rope.apply_rope`)."""
        if device not in self._rope:
            c = self.config
            assert c.d_head is not None, "GPTConfig derives d_head (d_model // n_heads) when not given"
            cos, sin = rope_tables(c.block_size, c.d_head, c.rope_base, device=device)
            self._rope[device] = (cos, sin, signed_sin(sin))
        return self._rope[device]

    def _run_blocks(
        self,
        x: torch.Tensor,
        rope: Sequence[torch.Tensor] | None,
        cache: LayerCache | None,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The blocks on ``x (B, T, d_model)``; the first call after :meth:`compile` falls back to eager if the
        compiler fails (see :meth:`compile`)."""
        if self._compile_state == "pending":
            return self._first_compiled_call(lambda: self._run_blocks(x, rope, cache, key_mask), cache)
        for block in self.blocks:
            x = block(x, rope, cache, key_mask=key_mask)
        return x

    def _checkpointed_blocks(
        self, x: torch.Tensor, rope: Sequence[torch.Tensor] | None, key_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """The blocks under activation checkpointing: same values and gradients, each block's activations
        recomputed in the backward pass (:attr:`gradient_checkpointing`)."""
        run = self._gradient_checkpointing_func or functools.partial(torch_checkpoint, use_reentrant=False)
        for i, block in enumerate(self.blocks):  # blocks 0, n, 2n, ... with n = checkpoint_every
            if i % self.checkpoint_every:
                x = block(x, rope, None, key_mask=key_mask)
            else:  # positional only: the reentrant checkpoint takes no keyword arguments
                x = run(block.__call__, x, rope, None, False, key_mask)
        return x

    def num_parameters(self) -> int:
        """Number of distinct parameters (tied weights counted once)."""
        return sum(p.numel() for p in self.parameters())

    def new_cache(self, capacity: int | None = None) -> KVCache:
        """An empty :class:`KVCache` for incremental decoding, preallocated for ``capacity`` positions
        (``1 <= capacity <= block_size``; default ``block_size``) on the first forward that uses it.

        Raises:
            ValueError: ``capacity`` outside ``[1, block_size]``.
        """
        c = self.config.block_size
        if capacity is not None and not (isinstance(capacity, int) and 1 <= capacity <= c):
            raise ValueError(f"capacity={capacity!r} must be an integer in [1, block_size={c}]")
        return KVCache(self.config.n_layer, c if capacity is None else capacity)

    def embed(
        self,
        idx: torch.Tensor,
        cache: KVCache | None = None,
        key_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        check_ids: bool = True,
    ) -> tuple[torch.Tensor, tuple | None]:
        """Checked token ids ``(B, T)`` -> the input of block 0 ``(B, T, d_model)`` and the RoPE tables of the
        current positions (``(cos, sin, signed sin)``, see :func:`coupled_qk.ops.rope.apply_rope`; ``None`` with
        learned positions). ``key_mask``: bool ``(B, T_past + T)`` from
        :func:`key_padding_mask`, which numbers the positions when ``position_ids`` is ``None``. Arguments
        and errors as :meth:`hidden_states`; ``check_ids=False`` skips the id-range check (a reduction over
        ``idx``; :meth:`generate` checks the prompt once)."""
        if not isinstance(idx, torch.Tensor):
            raise TypeError(f"idx must be a torch.Tensor of token ids with shape (B, T); got {type(idx).__name__}")
        if idx.dim() != 2 or idx.dtype not in (torch.long, torch.int32, torch.int64):
            raise ValueError(f"idx must be an integer tensor of shape (B, T); got {idx.dtype} {tuple(idx.shape)}")
        b, t = idx.shape
        weight = self.tok_emb.weight
        if idx.device != weight.device and weight.device.type != "meta":
            raise ValueError(
                f"idx is on {idx.device} but the model is on {weight.device}; move the ids there "
                f"(idx.to({str(weight.device)!r}))"
            )
        past = 0 if cache is None else cache.length
        if t == 0 or b == 0:
            raise ValueError(f"idx has a zero-sized dimension: shape {tuple(idx.shape)} (need B >= 1 and T >= 1)")
        if past + t > self.config.block_size:
            raise ValueError(
                f"sequence length {past + t} (cached {past} + new {t}) exceeds the context "
                f"block_size={self.config.block_size}"
            )
        check = idx.device.type == "cpu" and not torch.compiler.is_compiling()
        if check and check_ids:
            self._check_ids(idx)
        positions = _positions(position_ids, key_mask, b, past, t, self.config.block_size, idx.device, check)
        x = self.tok_emb(idx)
        rope = None
        if self.pos_emb is not None:
            x = x + self.pos_emb(positions)
        else:
            rope = tuple(t[positions] for t in self._rope_tables(idx.device))
            if positions.dim() == 2:  # per sequence: broadcast over heads
                rope = tuple(t.unsqueeze(1) for t in rope)
        return self.drop(x), rope

    def hidden_states(
        self,
        idx: torch.Tensor,
        cache: KVCache | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final hidden states ``(B, T, d_model)`` after the last LayerNorm (``forward`` is ``lm_head`` of these).

        Args:
            idx: token ids ``(B, T)``.
            cache: a :class:`KVCache` (or any object with ``length`` and ``update(layer_idx, k, v)``).
            attention_mask: ``(B, T_past + T)`` bool or 0/1 ints, 0 at padding (left or right); padded keys
                are hidden from every query in every variant. ``None``: no padding.
            position_ids: ``(B, T)``, ``(1, T)`` or ``(T,)`` integer positions of the new tokens; default: from
                ``attention_mask`` (real tokens numbered from 0, as in Hugging Face models), else ``T_past, ..., T_past
                + T - 1``.

        Raises:
            ValueError: ``idx`` not 2-D integer, ids outside ``[0, vocab_size)``, a sequence (plus cached
                positions) longer than ``block_size``, an ``attention_mask`` of the wrong shape or with values
                other than 0/1, ``position_ids`` of the wrong shape or outside ``[0, block_size)``.
        """
        key_mask = None
        if attention_mask is not None and idx.dim() == 2:  # (a bad idx is reported by embed)
            key_mask = key_padding_mask(
                attention_mask, idx.shape[0], idx.shape[1] + (0 if cache is None else cache.length)
            )
        x, rope = self.embed(idx, cache, key_mask, position_ids)
        if self.gradient_checkpointing and self.training and cache is None and torch.is_grad_enabled():
            run = functools.partial(self._checkpointed_blocks, x, rope, key_mask)  # compiled: with the eager fallback
            return self.ln_f(self._first_compiled_call(run) if self._compile_state == "pending" else run())
        return self.ln_f(self._run_blocks(x, rope, cache, key_mask))

    def forward(
        self,
        idx: torch.Tensor,
        cache: KVCache | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Next-token logits of ``idx``: :meth:`logits` of :meth:`hidden_states`.

        Args:
            idx: integer token ids ``(B, T)`` in ``[0, vocab_size)``, ``B, T >= 1``, ``T_past + T <= block_size``.
            cache: a :class:`KVCache` (``new_cache()``) read and extended in place; positions continue from its
                length.
            attention_mask: ``(B, T_past + T)`` bool or 0/1 integers, 0 at padding, or ``None``.
            position_ids: ``(B, T)``, ``(1, T)`` or ``(T,)`` integer positions, or ``None``.

        Returns:
            ``(B, T, vocab_size)`` logits in the parameters' dtype (the autocast dtype under ``torch.autocast``).

        Raises:
            TypeError: ``idx`` not a tensor. ValueError: as :meth:`hidden_states` (ids out of range, checked on CPU
                tensors only; too long a sequence; a bad mask or positions), naming the argument.
        """
        return self.logits(self.hidden_states(idx, cache, attention_mask, position_ids))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output head on hidden states ``(..., d_model)`` -> logits ``(..., vocab_size)``.

        With a padded vocabulary (``GPTConfig.vocab_pad_multiple``) the head computes ``padded_vocab_size``
        columns and the padding columns are dropped here (a view), so padded ids are never scored or sampled
        and the logits of real ids equal those of an unpadded model with the same weights.
        """
        head_t = self._transposed_head_for(hidden)  # opt-in decoding head (use_transposed_head)
        out = self.lm_head(hidden) if head_t is None else hidden @ head_t
        v = self.config.vocab_size
        if self.config.padded_vocab_size != v and getattr(self.lm_head, "out_features", None) == out.shape[-1]:
            out = out[..., :v]
        return out

    def trace(self, idx: torch.Tensor) -> Iterator[BlockTrace]:
        """Run the blocks on ``idx (B, T)`` through the eager attention path, yielding one :class:`BlockTrace`
        per block as soon as it has run (the final LayerNorm and output head are not computed; stop iterating
        to skip the remaining blocks). Gradients are tracked as in :meth:`forward`; wrap in ``torch.no_grad()``
        for diagnostics."""
        x, rope = self.embed(idx)
        for i, block in enumerate(self.blocks):
            out, rec = block(x, rope, None, record=True)
            yield BlockTrace(i, x, out, rec)
            x = out

    def loss(self, idx: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
        """Mean next-token cross-entropy (nats) of ``targets (B, T)`` given ``idx (B, T)`` (see
        :func:`coupled_qk.ops.losses.next_token_loss`)."""
        return next_token_loss(self(idx), targets, ignore_index)

    def _check_ids(self, idx: torch.Tensor) -> None:
        if idx.numel() and idx.device.type == "cpu":
            lo, hi = int(idx.min()), int(idx.max())
            if lo < 0 or hi >= self.config.vocab_size:
                raise ValueError(f"token ids must be in [0, {self.config.vocab_size}); got min {lo}, max {hi}")


def key_padding_mask(attention_mask: torch.Tensor | None, b: int, t_k: int) -> torch.Tensor | None:
    """A Hugging Face style ``attention_mask`` ``(B, T_k)`` (1 or True at tokens, 0 at padding) as bool;
    ``None`` when absent or (checked on CPU tensors only, to avoid a device sync) all ones.

    Raises:
        TypeError: not a tensor. ValueError: (CPU) values other than 0 and 1; a shape other than ``(b, t_k)``.
    """
    if attention_mask is None:
        return None
    check_attention_mask(attention_mask, not torch.compiler.is_compiling())
    check = attention_mask.device.type == "cpu" and not torch.compiler.is_compiling()
    if attention_mask.shape != (b, t_k):
        raise ValueError(
            f"attention_mask must have shape (B, T_past + T) = ({b}, {t_k}); got {tuple(attention_mask.shape)}"
        )
    mask = attention_mask.bool()
    return None if check and bool(mask.all()) else mask


def _positions(
    position_ids: torch.Tensor | None,
    key_mask: torch.Tensor | None,
    b: int,
    past: int,
    t: int,
    block_size: int,
    device: torch.device,
    check: bool,
) -> torch.Tensor:
    """Positions of the new tokens: ``position_ids`` (checked), else counted over ``key_mask``'s real tokens,
    else ``past, ..., past + t - 1``."""
    if position_ids is None:
        if key_mask is not None:
            return (key_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:]
        return torch.arange(past, past + t, device=device)
    return check_position_ids(position_ids, b, t, block_size, check)


def coupling_parameter_overhead(config: GPTConfig) -> dict:
    """Parameter counts of ``config`` and of its ``standard`` twin, and the overhead in percent.

    Returns ``{"params": int, "standard_params": int, "extra": int, "overhead_percent": float}``.
    """
    with torch.device("meta"):
        n = GPT(config).num_parameters()
        n0 = GPT(config.replace(attention="standard")).num_parameters()
    return dict(params=n, standard_params=n0, extra=n - n0, overhead_percent=100.0 * (n - n0) / n0)

"""The compiled path of :class:`~coupled_qk.models.gpt.GPT`: regional compilation with an eager
fallback, the fixed-shape decoding step over a :class:`~coupled_qk.layers.kv_cache.StaticKVCache` and its
compiled version, and the helpers that compile or uncompile the GPTs inside any module.

:class:`GPTCompileMixin` is a base class of ``GPT``; its methods use the model's ``blocks``, embeddings,
``_run_blocks`` and ``_rope_tables``. Source: PyTorch's "regional compilation" recipe and ``torch.compile``.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypedDict

import torch
import torch.nn as nn

from coupled_qk.checks.values import declared_flags
from coupled_qk.layers.kv_cache import LayerCache, StaticCache, StaticKVCache

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11

DecodeStep = Callable[[torch.Tensor, StaticKVCache], torch.Tensor]
"""A single-token decoding step ``(idx (B, 1), cache) -> logits (B, vocab)`` (:meth:`GPTCompileMixin.decode_step`)."""


class CompileOptions(TypedDict, total=False):
    """The keyword arguments of :func:`torch.compile` that :meth:`GPTCompileMixin.compile` takes (and
    :func:`compile_regions` passes on)."""

    backend: str
    mode: str | None
    dynamic: bool | None
    fullgraph: bool
    options: dict | None


class GPTCompileMixin:
    """Regional compilation and the compiled decoding step of :class:`~coupled_qk.models.gpt.GPT`."""

    # the model's state that these methods read and write (set by GPT.__init__)
    blocks: nn.ModuleList
    tok_emb: nn.Embedding
    pos_emb: nn.Embedding | None
    drop: nn.Dropout
    ln_f: nn.LayerNorm
    compile_info: dict[str, Any]
    _compile_state: str | None  # None (eager), "pending" (first call not yet made), "ok", "failed"
    _decode_step: DecodeStep | None
    _decode_settings: dict[str, Any] | None

    if TYPE_CHECKING:  # the model's methods these call (GPT, DecodingHeadMixin)

        def logits(self, hidden: torch.Tensor) -> torch.Tensor: ...

        def _rope_tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

        def _refresh_transposed_head(self) -> torch.Tensor | None: ...

    @declared_flags
    def compile(
        self,
        backend: str = "inductor",
        mode: str | None = None,
        dynamic: bool | None = None,
        fullgraph: bool = False,
        options: dict | None = None,
    ) -> GPTCompileMixin:
        """Compile the model in place, one block at a time (regional compilation); returns ``self``.

        Each transformer block's forward is compiled with ``torch.compile(backend, mode, dynamic, fullgraph,
        options)`` (``nn.Module.compile`` of every block): blocks of one variant share one compiled graph, so
        compile time does not grow with depth, and the parameter names (``state_dict``, checkpoints, the Hugging
        Face export) stay those of the eager model (no ``_orig_mod.`` prefix). The embedding, the output head
        and the loss stay eager. Compilation is lazy: it happens on the first forward (with or without
        ``gradient_checkpointing``), whose wall time is
        recorded in ``self.compile_info["first_call_s"]``. If that first call fails inside the compiler while
        the same call succeeds eagerly, the model falls back to eager for good with one ``RuntimeWarning``
        naming the error (``self.compile_info["error"]``); an error that eager execution raises too is
        re-raised unchanged. A failure in the lazily compiled backward surfaces at the first ``backward()``
        (the training loop probes forward and backward once; see :func:`compile_regions`).

        Dynamo's limit on graphs per function is raised for the process (:func:`make_graph_room`): every model's
        blocks share one Python function, and past the default limit (8 graphs: variants x modes x dtypes) the
        blocks would run eagerly without a word.

        Arguments are those of :func:`torch.compile`. Source: PyTorch "regional compilation" recipe.
        """
        make_graph_room()
        for block in self.blocks:
            block.compile(backend=backend, mode=mode, dynamic=dynamic, fullgraph=fullgraph, options=options)
        self._compile_state = "pending"
        decoding = {k: v for k, v in self.compile_info.items() if k.startswith("decode_")}  # its step is kept
        self.compile_info = dict(backend=backend, mode=mode, regional=True, **decoding)
        return self

    @property
    def is_compiled(self) -> bool:
        """Whether the blocks are compiled (``compile()`` was called and has not fallen back to eager)."""
        return self._compile_state in ("pending", "ok")

    def uncompile(self, reason: str | None = None) -> None:
        """Return to eager execution (keeps the weights); ``reason`` is recorded as ``compile_info["error"]``."""
        for block in self.blocks:
            block._compiled_call_impl = None
        self._compile_state = "failed" if reason else None
        if reason:
            self.compile_info["error"] = reason

    def _first_compiled_call(self, run: Callable[[], torch.Tensor], cache: LayerCache | None = None) -> torch.Tensor:
        """The first call after :meth:`compile`: ``run()`` (the blocks, plain or under activation checkpointing),
        retried eagerly if the compiler fails (see :meth:`compile`); ``cache`` is cropped back before the retry."""
        start = time.perf_counter()
        past = getattr(cache, "length", None)
        self._compile_state = "ok"
        try:
            y = run()
        except Exception as exc:  # noqa: BLE001 - decided below: compiler failure or the caller's error
            if cache is not None and past is not None and hasattr(cache, "crop"):
                cache.crop(past)  # forget what the failed call wrote
            saved = [b._compiled_call_impl for b in self.blocks]
            self.uncompile()
            try:
                y = run()
            except Exception:
                for b, impl in zip(self.blocks, saved):  # eager fails too: the caller's error, not the compiler's
                    b._compiled_call_impl = impl
                self._compile_state = "pending"
                raise
            reason = compile_error_summary(exc)
            self.uncompile(reason)
            warnings.warn(f"torch.compile failed ({reason}); the model runs eagerly", RuntimeWarning, stacklevel=3)
            return y
        self.compile_info["first_call_s"] = time.perf_counter() - start
        return y

    def decode_step(self, idx: torch.Tensor, cache: StaticKVCache) -> torch.Tensor:
        """One decoding step with fixed shapes: logits ``(B, vocab)`` of the tokens ``idx (B, 1)`` at slot
        ``cache.position`` (at each row's ``cache.positions`` in a padded batch), writing their keys and values there
        (the function :meth:`compiled_decode_step`
        compiles; it also runs eagerly). Nothing here reads a Python number that changes between steps, so a
        compiled version never recompiles; the caller advances ``cache`` afterwards."""
        return self.logits(self.static_hidden_states(idx, cache, getattr(cache, "positions", None))[:, -1])

    def static_hidden_states(
        self, idx: torch.Tensor, cache: StaticCache, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The body of :meth:`decode_step`: final hidden states ``(B, 1, d_model)`` of the tokens ``idx (B, 1)``,
        with fixed shapes. ``cache`` is a fixed-shape cache: ``position`` (``(1,)`` int64 tensor, the slot the
        token is written to), ``update(layer_idx, k, v)`` returning the whole buffers and ``attn_mask()`` the
        slots each query may see (:class:`StaticKVCache`, or the view of a ``transformers`` static cache in
        :mod:`coupled_qk.hf.cache_view`). ``positions``: ``(B, 1)`` int64 position of each token (left-padded
        batches number real tokens only), default ``cache.position`` for every row. Unchecked: the callers
        check ids and positions outside the compiled region."""
        pos = cache.position if positions is None else positions
        x = self.tok_emb(idx)
        rope: tuple[torch.Tensor, ...] | None = None
        if self.pos_emb is not None:
            x = x + self.pos_emb(pos)
        else:
            rope = tuple(t[pos] for t in self._rope_tables(idx.device))
            if pos.dim() == 2:  # per sequence: broadcast over heads
                rope = tuple(t.unsqueeze(1) for t in rope)
        x = self.drop(x)
        for block in self.blocks:
            x = block(x, rope, cache)
        return self.ln_f(x)

    @declared_flags
    def compiled_decode_step(
        self, backend: str = "inductor", mode: str | None = "auto", fullgraph: bool = False, options: dict | None = None
    ) -> DecodeStep:
        """The compiled :meth:`decode_step`, built on the first call and kept on the model: every :meth:`generate`
        with ``compile=True`` and every later call with all arguments at their defaults reuse it, whatever it was
        built with; a later call with other arguments than the kept step's compiles a new step with them and
        keeps that one instead (it used to return the kept step, ignoring them). ``mode="auto"``:
        ``"reduce-overhead"`` (CUDA graphs) on CUDA, the default mode elsewhere. ``options``: Inductor options
        (``torch.compile(options=...)``, which excludes ``mode``: with ``options``, ``"auto"`` on CUDA becomes
        ``options["triton.cudagraphs"] = True``, and another ``mode`` raises ``ValueError``). On CPU
        ``options={"cpp_wrapper": True}`` makes every variant's step faster (batch 1 at ``tiny``: 0.78x of the time)
        at about twice the compile time (``benchmarks/results/fastpath/decode-options``). Shapes are static
        (``dynamic=False``): one graph per batch
        size and cache capacity (:func:`static_capacity` rounds capacities to powers of two); Dynamo's limit on
        graphs per function is raised so that many models and shapes never fall back to eager silently
        (:func:`make_graph_room`).

        The kept step is rebuilt (with its own arguments) when the model has moved to another device type since
        (a step built on CPU would run on CUDA without the CUDA graphs of ``"auto"``).

        The returned callable ``(idx (B, 1), cache) -> logits (B, vocab)`` compiles on its first call; if that
        call fails in the compiler (and :meth:`decode_step` succeeds eagerly) it warns once
        (``RuntimeWarning``) and decodes eagerly from then on. It raises ``ValueError`` for a full
        :class:`StaticKVCache` (``next_slot == capacity``).
        """
        settings = dict(backend=backend, mode=mode, fullgraph=fullgraph, options=options)
        device = self.tok_emb.weight.device.type  # "auto" means CUDA graphs on CUDA: decided per device type
        built = self._decode_settings
        kept = {k: v for k, v in (built or {}).items() if k != "device"}
        if self._decode_step is not None and built is not None and settings in (kept, DECODE_DEFAULTS):
            if built["device"] == device:
                return self._decode_step
            settings = kept  # the model moved: the same step again, built for its device
            backend, mode, fullgraph, options = (kept[k] for k in ("backend", "mode", "fullgraph", "options"))
        mode, options = compile_mode(mode, options, cuda=device == "cuda")
        make_graph_room()
        compiled = torch.compile(
            self.decode_step, backend=backend, mode=mode, dynamic=False, fullgraph=fullgraph, options=options
        )
        # after the first call: the compiled step, or the eager one after a failure
        state: dict[str, DecodeStep | None] = {"fn": None}

        def step(idx: torch.Tensor, cache: StaticKVCache) -> torch.Tensor:
            full = getattr(cache, "next_slot", -1) >= getattr(cache, "capacity", 0)  # a compiled write past the
            if full:  # buffers fails inside a kernel, with a message naming none of this
                raise ValueError(
                    f"the StaticKVCache is full: all capacity={cache.capacity} slots are written; "
                    "decode fewer tokens or start from a larger cache (GPT.new_cache(capacity))"
                )
            self._refresh_transposed_head()  # the opt-in decoding head follows the weights (decode_head.py)
            fn = state["fn"]
            if fn is not None:
                return fn(idx, cache)
            state["fn"] = compiled
            start = time.perf_counter()
            saved = [t.clone() for t in cache.k + cache.v]  # a failed first call may have written its slot
            try:
                logits = compiled(idx, cache)
            except Exception as exc:  # noqa: BLE001 - compiler failure: fall back if eager works
                for t, s in zip(cache.k + cache.v, saved):
                    t.copy_(s)
                logits = self.decode_step(idx, cache)  # raises the caller's own errors
                reason = compile_error_summary(exc)
                self.compile_info["decode_error"] = reason
                self._decode_step = state["fn"] = self.decode_step
                warnings.warn(
                    f"torch.compile of the decoding step failed ({reason}); decoding eagerly",
                    RuntimeWarning,
                    stacklevel=2,
                )
                return logits
            self.compile_info["decode_first_call_s"] = time.perf_counter() - start
            return logits

        self._decode_step, self._decode_settings = step, {**settings, "device": device}
        return step


def compile_mode(mode: str | None, options: dict | None, cuda: bool) -> tuple[str | None, dict | None]:
    """``torch.compile``'s ``(mode, options)`` for :meth:`GPTCompileMixin.compiled_decode_step`'s: ``"auto"`` is
    ``"reduce-overhead"`` (CUDA graphs) on CUDA and the default mode elsewhere; with ``options`` (which
    ``torch.compile`` takes instead of a mode) ``"auto"`` on CUDA becomes ``options["triton.cudagraphs"] = True``.

    Raises:
        ValueError: ``options`` with a ``mode`` other than ``"auto"`` or ``None``.
    """
    if options is None:
        return ("reduce-overhead" if cuda else None) if mode == "auto" else mode, None
    if mode not in ("auto", None):
        raise ValueError(
            f"compiled_decode_step: mode={mode!r} and options cannot both be given "
            "(torch.compile takes one or the other); use mode='auto' or None with options"
        )
    return None, {**({"triton.cudagraphs": True} if cuda and mode == "auto" else {}), **options}


DECODE_DEFAULTS = dict(backend="inductor", mode="auto", fullgraph=False, options=None)
"""The default arguments of :meth:`GPTCompileMixin.compiled_decode_step`: a call with these returns the kept step."""

GRAPH_ROOM = 256


def make_graph_room() -> None:
    """Let Dynamo hold up to :data:`GRAPH_ROOM` graphs per function (its default limit is 8); called by
    :meth:`GPT.compile` and :meth:`GPT.compiled_decode_step`. Raises ``torch._dynamo.config.recompile_limit``
    (and the accumulated limit) for the process, never lowers them.

    Why: Dynamo counts graphs per Python function, and every model of the process shares ours
    (``Block.forward`` for regional compilation, :meth:`GPT.decode_step` for compiled decoding): one graph per
    variant, training/evaluation mode, dtype, batch size and cache capacity. Past the limit it silently runs
    the function eagerly, so ``compare --compile`` over five variants, or a benchmark of several, would
    measure eager code while calling it compiled. A process-wide setting rather than a per-call context,
    because entering a context costs 15-80 us per call (a decoding step is ~400 us).
    """
    import torch._dynamo

    config = torch._dynamo.config
    if config.recompile_limit < GRAPH_ROOM:
        config.recompile_limit = GRAPH_ROOM
    if config.accumulated_recompile_limit < GRAPH_ROOM:
        config.accumulated_recompile_limit = GRAPH_ROOM


def compile_error_summary(exc: BaseException) -> str:
    """``"<ExceptionType>: <first non-empty line>"`` of a compiler error, followed by the same for the error it
    wraps (a backend's own exception inside Dynamo's ``BackendCompilerFailed``); at most 300 characters."""

    def line(e: BaseException) -> str:
        lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
        return f"{type(e).__name__}: {lines[0] if lines else ''}"

    inner = getattr(exc, "inner_exception", None) or exc.__cause__
    return (line(exc) + (f" <- {line(inner)}" if inner is not None and inner is not exc else ""))[:300]


def compile_regions(module: nn.Module, **kwargs: Unpack[CompileOptions]) -> list[GPTCompileMixin]:
    """Regional compilation of ``module`` in place: :meth:`GPT.compile` on every :class:`GPT` it is or
    contains (a classifier wrapping a GPT included); a module without one is compiled whole, in place
    (``nn.Module.compile``: its ``state_dict`` keeps its names). ``kwargs`` go to :func:`torch.compile`.
    Returns the compiled GPTs (empty for a whole-module compile). Undo with :func:`uncompile_regions`."""
    # read as objects: a type checker cannot narrow nn.Module to GPTCompileMixin (their compile methods differ)
    submodules: Iterable[object] = module.modules()
    gpts = [m for m in submodules if isinstance(m, GPTCompileMixin)]
    for g in gpts:
        g.compile(**kwargs)
    if not gpts:
        make_graph_room()
        module.compile(**kwargs)
    return gpts


def uncompile_regions(module: nn.Module, reason: str | None = None) -> None:
    """Undo :func:`compile_regions`: every compiled submodule of ``module`` (and ``module``) runs eagerly."""
    for m in module.modules():
        if isinstance(m, GPTCompileMixin):
            m.uncompile(reason)
        m._compiled_call_impl = None

"""The shared forward body of :class:`~coupled_qk.hf.modeling.CoupledQKModel` and
:class:`~coupled_qk.hf.modeling.CoupledQKForCausalLM`: the input checks, the cache, ``inputs_embeds``,
``output_hidden_states`` and the tuple output of ``return_dict=False``."""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
from transformers.cache_utils import DynamicCache
from transformers.utils import logging

from coupled_qk.hf.cache_view import CacheView, StaticStep, static_layers
from coupled_qk.hf.inputs import cache_arg, check_cache_batch, check_inputs

logger = logging.get_logger("coupled_qk.hf.modeling")


@contextlib.contextmanager
def embeddings_given(embedding: nn.Module, inputs_embeds: torch.Tensor | None):
    """While active, ``embedding``'s output is ``inputs_embeds`` ``(B, T, d_model)`` (cast to the dtype of the
    rows it would have looked up), so the wrapped ``GPT`` runs on placeholder ids with the caller's embeddings in
    place of its token lookup: positions (learned or RoPE), dropout, masks and the cache are as with ids, and
    gradients flow to ``inputs_embeds``. ``None``: nothing changes."""
    if inputs_embeds is None:
        yield
        return
    handle = embedding.register_forward_hook(lambda module, args, out: inputs_embeds.to(out.dtype))
    try:
        yield
    finally:
        handle.remove()


def run_gpt(module, input_ids, attention_mask, position_ids, cache, use_cache, kwargs):
    """Check the inputs, set up the ``DynamicCache`` (when caching) and run the wrapped GPT of ``module`` to its
    final hidden states, on ``input_ids (B, T)`` or ``kwargs["inputs_embeds"] (B, T, d_model)``.

    Returns:
        ``(hidden (B, T, d_model), cache, use_cache, hidden_states)``; ``hidden_states`` is ``None`` unless
        ``output_hidden_states`` (argument, else the config): then ``n_layer + 1`` tensors (:func:`_with_states`).

    Raises:
        ValueError, TypeError: as :func:`~coupled_qk.hf.inputs.check_inputs` and ``GPT.hidden_states``.
    """
    embeds = kwargs.get("inputs_embeds")
    check_inputs(input_ids, kwargs, use_cache, module.config.d_model, module.model.tok_emb.weight.device)
    if embeds is not None:  # placeholders for the shapes and checks; embeddings_given replaces their lookup
        input_ids = torch.zeros(embeds.shape[:2], dtype=torch.long, device=embeds.device)
    cache = cache_arg(cache, kwargs)
    check_cache_batch(cache, input_ids.shape[0])
    asked = use_cache
    use_cache = module.config.use_cache if use_cache is None else use_cache
    if use_cache and module.model.gradient_checkpointing and module.training and torch.is_grad_enabled():
        if cache is not None or asked:  # (the config's default use_cache=True is dropped silently)
            logger.warning_once(
                "use_cache=True is incompatible with gradient checkpointing while training; "
                "running without a cache (use_cache=False)"
            )
        use_cache, cache = False, None
    if use_cache and cache is None:
        cache = DynamicCache(config=module.config)
    if kwargs.get("output_attentions"):
        raise ValueError(
            "output_attentions=True is not supported by coupled-qk models (they score with SDPA); use "
            "coupled_qk.GPT.trace(idx) for each layer's attention probabilities, queries and keys"
        )
    gpt = module.model
    if use_cache and input_ids.shape[1] == 1 and not torch.is_grad_enabled() and static_layers(cache):
        # a decoding step over a filled static cache: fixed shapes, one compiled graph (cache_view.StaticStep)
        if not torch.compiler.is_compiling() and input_ids.device.type == "cpu":
            gpt._check_ids(input_ids)
        view = StaticStep(cache, attention_mask, position_ids, input_ids.shape[0], gpt.config.block_size)

        def run():
            return gpt.static_hidden_states(input_ids, view, view.positions)
    else:
        view = CacheView(cache) if cache is not None else None

        def run():
            return gpt.hidden_states(input_ids, view, attention_mask, position_ids)

    with embeddings_given(gpt.tok_emb, embeds):
        if not config_default(kwargs, "output_hidden_states", module.config):
            return run(), cache, use_cache, None
        hidden, states = _with_states(gpt, run)
    return hidden, cache, use_cache, states


def _with_states(gpt, run) -> tuple:
    """``run()``'s final hidden states and ``transformers``' ``hidden_states`` of that run: the embeddings (block
    0's input), each block's output, the last one after the final LayerNorm (``n_layer + 1`` tensors)."""
    states = []
    hooks = [gpt.blocks[0].register_forward_pre_hook(lambda m, args: states.append(args[0]))]
    hooks += [b.register_forward_hook(lambda m, args, out: states.append(out)) for b in gpt.blocks]
    try:
        hidden = run()
    finally:
        for h in hooks:
            h.remove()
    return hidden, (*states[:-1], hidden)


def config_default(kwargs: dict, name: str, config):
    """The switch ``name`` of a forward call: the argument, or the config's when it is left out or ``None`` (as in
    ``transformers``' models; ``peft``'s prompt tuning passes ``return_dict=None``, which gave a tuple)."""
    value = kwargs.get(name)
    return getattr(config, name) if value is None else value


def as_output(module, output, kwargs):
    """``output`` as a tuple when ``return_dict=False`` (argument, else the config), as ``transformers`` models."""
    return output if config_default(kwargs, "return_dict", module.config) else output.to_tuple()

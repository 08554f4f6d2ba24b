"""Native ``transformers`` models around :class:`coupled_qk.GPT`: ``CoupledQKModel`` and ``CoupledQKForCausalLM``.

The wrapped ``GPT`` lives under the attribute ``model`` (weight names ``model.tok_emb.weight``, ...), so the
two classes read the same folders. Decoding reuses the ``transformers`` cache classes: ``generate`` builds a
``DynamicCache`` and :class:`CacheView` lets ``GPT`` append its keys and values to it (keys after the
dynamics and RoPE, one per query head for the coupled variants; see :class:`coupled_qk.KVCache`), so cached
decoding is exact for every variant (``docs/METHOD.md`` section 1). ``attention_mask`` (0 at padding, left
or right) hides padded keys in every variant and positions count real tokens only.

The usual ``transformers`` contract holds (``tests/hf/test_hf_contract.py``, over every registered variant): static
caches (:class:`CacheView`), ``resize_token_embeddings`` (config and tie kept), ``Trainer`` with gradient
accumulation (the loss honours ``num_items_in_batch``), activation checkpointing per block
(``activation_checkpointing_enable()``, through ``GPT.gradient_checkpointing``) and LoRA through ``peft``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
from pathlib import Path

import torch
import torch.nn as nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from coupled_qk.checks.tensors import check_checkpoint_kwargs
from coupled_qk.checks.values import declared_flags
from coupled_qk.hf.cache_view import static_layers
from coupled_qk.hf.configuration import CoupledQKConfig
from coupled_qk.hf.forward import as_output, run_gpt
from coupled_qk.hf.inputs import check_folder, check_hf_generate_args, check_labels, check_saved_files
from coupled_qk.layers.attention import LEGACY_STATE_KEYS, CausalSelfAttention
from coupled_qk.layers.qk_maps import QKMap
from coupled_qk.layers.scoring import ScoringRule
from coupled_qk.models.gpt import GPT

TIED = "model.lm_head.weight"  # tied to model.tok_emb.weight, never stored


def fresh_parameters(module: nn.Module, attn: CausalSelfAttention, options) -> None:
    """``module``'s own parameters that ``transformers`` did not load get those of a new one built as the layer
    ``attn`` builds it: ``Map(d_head, n_heads, **options)`` (``GPTConfig.qk_map``),
    ``Rule(d_head, n_heads, layer_idx)``."""
    own = dict(module.named_parameters(recurse=False))
    if all(getattr(p, "_is_hf_initialized", False) for p in own.values()):
        return
    with torch.device("cpu"), torch.random.fork_rng(devices=[]):  # the global stream is left as it was
        if isinstance(module, QKMap):
            new = type(module)(attn.d_head, attn.n_heads, **dataclasses.asdict(options))
        else:
            new = type(module)(attn.d_head, attn.n_heads, attn.layer_idx)
    for name, p in own.items():
        init.copy_(p, getattr(new, name).detach().to(p.device, p.dtype))


def legacy_key_mapping() -> dict[str, str]:
    """``transformers``' ``key_mapping`` (regex -> replacement) that reads weights saved under the attention
    layer's earlier names (:data:`~coupled_qk.layers.attention.LEGACY_STATE_KEYS`: e.g. Differential Attention's
    ``attn.lambda_q1``, now ``attn.scorer.lambda_q1``), so exports written before the change still load."""
    out = {}
    for old, new in LEGACY_STATE_KEYS:
        pattern = r"\.attn\." + re.escape(old) + ("" if old.endswith(".") else "$")
        out[pattern] = f".attn.{new}"
    return out


class CoupledQKPreTrainedModel(PreTrainedModel):
    """Shared loading, saving and initialisation of the coupled-qk ``transformers`` models.

    ``from_pretrained`` is strict by default: a folder without ``config.json`` raises ``FileNotFoundError``,
    and missing weights, unexpected weights or weights of the wrong shape raise ``ValueError`` listing them.
    ``strict=False`` initialises missing (and mismatched) weights exactly as :class:`coupled_qk.GPT` does
    (:meth:`_init_weights`) and ignores unexpected ones, e.g. to add coupling to a ``standard`` checkpoint.
    """

    config_class = CoupledQKConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]
    _tied_weights_keys = {TIED: "model.tok_emb.weight"}
    # never stored (tied): Trainer's resume then re-ties it instead of warning that it is missing
    _keys_to_ignore_on_save = [TIED]
    _supports_sdpa = True
    supports_gradient_checkpointing = True  # GPT.gradient_checkpointing: one checkpoint per block

    def __init__(self, config: CoupledQKConfig):
        super().__init__(config)
        self.model = GPT(config.to_gpt_config())
        residual_std = 0.02 / math.sqrt(2 * config.n_layer)
        for name, module in self.model.named_modules():
            if name.endswith("out_proj"):  # residual output projections: GPT-2's scaled init (as GPT does)
                module._init_std = residual_std
        if not self.model.tok_emb.weight.is_meta:
            # built for real (not by from_pretrained, which builds on the meta device): GPT has initialised every
            # weight itself, so keep those exact values instead of drawing them again in post_init
            for p in self.model.parameters():
                p._is_hf_initialized = True
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Initialise ``module``'s own parameters as :class:`coupled_qk.GPT` does (GPT-2 init).

        Linear and embedding weights ``N(0, 0.02)`` (a bias as ``nn.Linear``'s, uniform ``+-1/sqrt(fan_in)``),
        residual output projections (``out_proj``) ``N(0, 0.02 / sqrt(2 n_layer))``, LayerNorm/RMSNorm ``1`` and
        ``0``, differential lambdas ``N(0, 0.1)`` (:class:`~coupled_qk.layers.differential.DifferentialScoring`'s
        ``reset_parameters``); the parameters a query-key map or an added scoring rule holds
        itself (``dt``, a plugin's own tensors) take the values of a freshly built one (:func:`fresh_parameters`)
        unless the rule has ``reset_parameters()``; any other module with parameters of its own and a
        ``reset_parameters()`` (the coupling networks, a plugin's layers) calls it. Parameters already loaded
        (flagged by ``transformers``) are left alone.
        """
        if isinstance(module, (nn.Linear, nn.Embedding)):
            init.normal_(module.weight, mean=0.0, std=getattr(module, "_init_std", 0.02))
            if getattr(module, "bias", None) is not None:  # none in GPT's own layers; a plugin map's
                bound = 1 / math.sqrt(module.in_features) if module.in_features else 0.0
                init.uniform_(module.bias, -bound, bound)
        elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
            if module.weight is not None:
                init.ones_(module.weight)
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)
        elif isinstance(module, (QKMap, ScoringRule)) and not hasattr(module, "reset_parameters"):
            attn = next((b.attn for b in self.model.blocks if module is b.attn.qk_map or module is b.attn.scorer), None)
            if attn is not None:
                fresh_parameters(module, attn, self.model.config.qk_map)
        elif hasattr(module, "reset_parameters") and (
            isinstance(module, (QKMap, ScoringRule)) or next(module.parameters(recurse=False), None) is not None
        ):
            module.reset_parameters()  # torch.nn.init is guarded by transformers here: loaded weights stay

    @declared_flags
    def _set_gradient_checkpointing(
        self, enable: bool = True, gradient_checkpointing_func=None, every_n_layers: int = 1
    ) -> None:
        """``transformers``' switch behind ``activation_checkpointing_enable(every_n_layers=...)``: our blocks are
        not ``GradientCheckpointingLayer`` modules, so the wrapped ``GPT`` is told to checkpoint every
        ``every_n_layers``-th block (blocks 0, n, 2n, ...; ``GPT.checkpoint_every``) instead of ignoring it.

        Raises:
            ValueError: ``every_n_layers`` not a positive integer; a keyword of ``gradient_checkpointing_kwargs`` that
                ``torch.utils.checkpoint.checkpoint`` does not declare, or a flag of it that is not a bool
                (:func:`~coupled_qk.checks.tensors.check_checkpoint_kwargs`).
        """
        if isinstance(every_n_layers, bool) or not isinstance(every_n_layers, int) or every_n_layers < 1:
            raise ValueError(f"every_n_layers={every_n_layers!r} must be a positive integer (1: every block)")
        if isinstance(gradient_checkpointing_func, functools.partial):  # transformers' partial(checkpoint, **kwargs)
            check_checkpoint_kwargs(gradient_checkpointing_func.keywords)
        kwargs = (
            {} if gradient_checkpointing_func is None else {"gradient_checkpointing_func": gradient_checkpointing_func}
        )
        super()._set_gradient_checkpointing(enable=enable, every_n_layers=every_n_layers, **kwargs)
        self.model.checkpoint_every = every_n_layers if enable else 1

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding ``model.tok_emb`` (``(padded_vocab_size, d_model)`` weight, tied to the output head;
        ``PreTrainedModel.get_input_embeddings``)."""
        return self.model.tok_emb

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        """Replace the token embedding ``model.tok_emb`` by ``value`` (``PreTrainedModel.set_input_embeddings``). The
        output head keeps the previous weight until ``tie_weights()`` ties it to ``value`` again
        (:meth:`resize_token_embeddings` re-ties it itself)."""
        self.model.tok_emb = value

    def get_output_embeddings(self) -> nn.Linear:
        """The output head ``model.lm_head`` (``(vocab_size, d_model)`` weight, tied to the input embedding)."""
        return self.model.lm_head

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        """Replace the output head ``model.lm_head`` by ``new_embeddings`` (``PreTrainedModel.set_output_embeddings``,
        which ``resize_token_embeddings`` and ``tie_weights`` call)."""
        self.model.lm_head = new_embeddings

    @declared_flags
    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        """``PreTrainedModel.resize_token_embeddings``, then the wrapped ``GPT``'s config takes the new
        ``vocab_size`` too (its id check and ``save_pretrained``'s ``config.json`` agree), and the output head
        stays tied to the input embedding (one tensor).

        With ``vocab_pad_multiple > 1`` the embedding keeps ``padded_vocab_size`` rows (the new vocabulary
        rounded up to that multiple, and to ``pad_to_multiple_of`` too), so a saved folder loads back: its
        ``config.json`` builds exactly that many rows. ``vocab_size`` is ``new_num_tokens``, or the rows when
        ``pad_to_multiple_of`` is given (as ``transformers`` does).

        Raises:
            ValueError: ``new_num_tokens`` not a positive integer (or ``None``: only pad to the multiple).
        """
        if new_num_tokens is not None and (
            isinstance(new_num_tokens, bool) or not isinstance(new_num_tokens, int) or new_num_tokens < 1
        ):
            raise ValueError(f"new_num_tokens={new_num_tokens!r} must be a positive integer (or None)")
        if pad_to_multiple_of is not None and (
            isinstance(pad_to_multiple_of, bool) or not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1
        ):
            raise ValueError(f"pad_to_multiple_of={pad_to_multiple_of!r} must be a positive integer (or None)")
        multiple = math.lcm(self.model.config.vocab_pad_multiple, pad_to_multiple_of or 1)
        embeddings = super().resize_token_embeddings(new_num_tokens, multiple if multiple > 1 else None, mean_resizing)
        if pad_to_multiple_of:
            n = embeddings.weight.shape[0]
        else:
            n = self.model.config.vocab_size if new_num_tokens is None else new_num_tokens
        self.config.vocab_size = n
        self.model.config = self.model.config.replace(vocab_size=n)
        if self.config.tie_word_embeddings:
            self.model.lm_head.weight = self.model.tok_emb.weight
        return embeddings

    @classmethod
    def from_gpt(cls, model: GPT, **config_kwargs):
        """Wrap an existing :class:`coupled_qk.GPT` (parameters shared, not copied); ``config_kwargs`` go to
        :class:`CoupledQKConfig` (e.g. ``eos_token_id``)."""
        if not isinstance(model, GPT):
            raise TypeError(f"model must be a coupled_qk.GPT; got {type(model).__name__}")
        config = CoupledQKConfig.from_gpt_config(model.config, **config_kwargs)
        with torch.device("meta"):  # skip building and initialising a throw-away GPT
            wrapper = cls(config)
        wrapper.model = model
        return wrapper

    @classmethod
    @declared_flags
    def from_pretrained(cls, pretrained_model_name_or_path, *args, strict: bool = True, **kwargs):
        """``PreTrainedModel.from_pretrained`` that refuses incomplete folders (see the class docstring).

        Args:
            pretrained_model_name_or_path: a folder written by ``save_pretrained`` / ``coupled-qk export``.
            strict: refuse missing, unexpected and mismatched weights (default); ``False`` initialises
                missing and mismatched ones like ``GPT`` and ignores unexpected ones.
            *args, **kwargs: as ``transformers``' ``from_pretrained`` (``output_loading_info``,
                ``ignore_mismatched_sizes``, ``dtype``, ...).

        Weights saved under the attention layer's earlier names load (:func:`legacy_key_mapping`); saving the model
        again writes today's names.

        Raises:
            FileNotFoundError: a local folder without ``config.json`` (or a training run folder).
            ValueError: a damaged weights file or weight index, naming it
                (:func:`~coupled_qk.hf.inputs.check_saved_files`); (``strict``) missing / unexpected / mismatched
                weights, naming them; an invalid config field (from :class:`CoupledQKConfig`).
        """
        folder = Path(os.fspath(pretrained_model_name_or_path)).expanduser()
        check_folder(folder)
        check_saved_files(folder)  # a damaged weights file is named (not safetensors' own message alone)
        legacy = legacy_key_mapping()
        kwargs["key_mapping"] = {**(kwargs.get("key_mapping") or {}), **legacy}
        want_info = kwargs.pop("output_loading_info", False)
        allow_mismatch = kwargs.pop("ignore_mismatched_sizes", False) or not strict
        model, info = super().from_pretrained(
            pretrained_model_name_or_path, *args, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs
        )
        # transformers reverts the renamings it used when the model is saved again: not ours (save today's names)
        used = getattr(model, "_weight_conversions", None) or []
        model._weight_conversions = [c for c in used if not set(getattr(c, "source_patterns", ())) & set(legacy)]
        missing = sorted(k for k in info["missing_keys"] if k != TIED)
        unexpected = sorted(info["unexpected_keys"])
        mismatched = sorted(info["mismatched_keys"])
        problems = []
        if strict and missing:
            problems.append(f"missing weights {missing}")
        if strict and unexpected:
            problems.append(f"unexpected weights {unexpected}")
        if mismatched and not allow_mismatch:
            problems.append(
                "weights of the wrong shape "
                + ", ".join(f"{k} (stored {tuple(a)}, model {tuple(b)})" for k, a, b in mismatched)
            )
        if problems:
            raise ValueError(
                f"{pretrained_model_name_or_path} does not match the model its config.json describes: "
                + "; ".join(problems)
                + ". Check that config.json belongs to these weights, or pass strict=False "
                "to initialise missing/mismatched weights as a new model would (and ignore unexpected ones)."
            )
        return (model, info) if want_info else model


class CoupledQKModel(CoupledQKPreTrainedModel):
    """Base model: ``input_ids (B, T)`` -> ``last_hidden_state (B, T, d_model)`` (after the final LayerNorm).

    ``forward(input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=None)`` returns a
    ``BaseModelOutputWithPast``; arguments as :meth:`CoupledQKForCausalLM.forward`.
    """

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, use_cache=None, **kwargs):
        """``input_ids`` (integer ``(B, T)``, or ``inputs_embeds`` ``(B, T, d_model)``) -> ``BaseModelOutputWithPast``
        with ``last_hidden_state`` ``(B, T, d_model)`` (after the final LayerNorm, in the parameters' dtype),
        ``cache`` (the extended ``transformers`` ``Cache`` when ``use_cache``, else ``None``) and ``hidden_states``
        (``n_layer + 1`` tensors ``(B, T, d_model)`` with ``output_hidden_states``); a tuple with
        ``return_dict=False``. Arguments as :meth:`CoupledQKForCausalLM.forward`.

        Raises:
            TypeError, ValueError: as :meth:`CoupledQKForCausalLM.forward` (naming the argument).
        """
        hidden, cache, use_cache, states = run_gpt(
            self, input_ids, attention_mask, position_ids, cache, use_cache, kwargs
        )
        out = BaseModelOutputWithPast(
            last_hidden_state=hidden, cache=cache if use_cache else None, hidden_states=states
        )
        return as_output(self, out, kwargs)


class CoupledQKForCausalLM(CoupledQKPreTrainedModel, GenerationMixin):
    """Causal LM: ``input_ids (B, T)`` -> ``logits (B, T, vocab_size)`` (float, parameters' dtype).

    ``forward(input_ids, attention_mask=None, position_ids=None, cache=None, labels=None, use_cache=None,
    logits_to_keep=0)``:

    - ``inputs_embeds``: ``(B, T, d_model)`` token embeddings instead of ``input_ids`` (e.g. prompt tuning):
      the same result as the ids they embed (``model.get_input_embeddings()(input_ids)``); not both.
    - ``attention_mask``: ``(B, T_past + T)``, 1 at tokens and 0 at padding (left or right).
    - ``position_ids``: ``(B, T)``; default from ``attention_mask`` (real tokens numbered from 0).
    - ``cache``: a ``transformers`` ``Cache`` to read and extend (``generate`` passes a ``DynamicCache``);
      with ``use_cache`` (default ``config.use_cache``) a new one is created and returned.
    - ``labels``: the *unshifted* input ids (``-100`` ignored); ``loss`` is the mean next-token cross-entropy
      in nats, as in every Hugging Face causal LM. ``num_items_in_batch`` (passed by ``Trainer`` with gradient
      accumulation: the number of non-ignored targets over all the micro-batches of one optimizer step) makes
      it the *sum* divided by that number instead, so that accumulated micro-batches give the gradient of one
      large batch (``transformers``' ``ForCausalLMLoss``); ``shift_labels`` (already shifted targets) are
      honoured the same way.
    - ``logits_to_keep``: compute logits for the last ``n`` positions only (0 = all), or for the positions of
      a 1-D integer tensor (as ``transformers``' models); with ``labels`` it must keep all.
    - ``output_hidden_states``: also return ``hidden_states``, ``n_layer + 1`` tensors ``(B, T, d_model)``: the
      embeddings, each block's output, the last one after the final LayerNorm (as ``transformers`` models).
    - ``return_dict=False``: a tuple instead of the output object.

    ``generate`` works with greedy, sampling and beam search, cached (default) or not (``use_cache=False``),
    from ``input_ids`` or ``inputs_embeds``, and a left-padded batch generates what each prompt generates alone.
    Source: ``docs/METHOD.md`` section 1.

    Raises:
        ValueError: ``output_attentions=True`` (unsupported), both or neither of ``input_ids`` and
            ``inputs_embeds`` (:func:`~coupled_qk.hf.inputs.check_inputs`), and the input errors of
            :meth:`coupled_qk.GPT.hidden_states` (ids out of range, too long, bad mask or positions).
    """

    def generate(self, inputs=None, generation_config=None, **kwargs):
        """``GenerationMixin.generate`` with its arguments checked once per call, before any token is computed,
        as :meth:`coupled_qk.GPT.generate`'s (:func:`coupled_qk.checks.tensors.check_generate_args`): the prompt
        ``(B, T)`` integer ids in the vocabulary (or ``inputs_embeds`` ``(B, T, d_model)``); ``max_new_tokens`` (or what
        ``max_length`` leaves) an int
        ``>= 0`` with ``T + max_new_tokens <= block_size`` (the model cannot see further: without this check the
        error came after the first ``block_size - T`` tokens); ``temperature``, ``top_k``, ``top_p``,
        ``repetition_penalty`` in range when given; ``num_beams``, ``num_return_sequences`` and
        ``num_beam_groups`` ints ``>= 1`` when given; ``use_cache`` a bool; ``attention_mask`` of the prompt's
        shape with a real token in each row. Everything else is ``transformers``' (beam search, stopping
        criteria, ...).

        Raises:
            TypeError, ValueError: naming the argument (see :func:`~coupled_qk.checks.tensors.check_generate_args`).
        """
        ids = inputs if inputs is not None else kwargs.get("input_ids")
        if ids is not None or kwargs.get("inputs_embeds") is not None:
            check_hf_generate_args(ids, self.config, generation_config or self.generation_config, kwargs, self.device)
        return super().generate(inputs, generation_config, **kwargs)

    def create_masks_for_generate(self, config, inputs_embeds, attention_mask=None, cache=None, **kwargs):
        """``generate`` asks for a 4-D mask with static caches; our forward takes the 2-D ``attention_mask``
        ``(B, T_past + T)`` with every cache (the causal part is built inside), so it is returned unchanged,
        except for single-token steps over a filled static cache: there it is padded with zeros to
        ``(B, max_cache_len)``, so that every decoding step has the same shapes (one compiled graph)."""
        if (
            attention_mask is not None
            and attention_mask.dim() == 2
            and inputs_embeds.shape[1] == 1
            and static_layers(cache)
        ):
            size = cache.layers[0].max_cache_len
            if attention_mask.shape[1] < size:
                attention_mask = torch.nn.functional.pad(attention_mask, (0, size - attention_mask.shape[1]))
        return attention_mask

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        cache=None,
        labels=None,
        use_cache=None,
        logits_to_keep: int = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Logits of the next token at every position (or the kept ones), and the loss when ``labels`` are given.

        Args:
            input_ids: integer ``(B, T)`` token ids in ``[0, vocab_size)``, ``T_past + T <= block_size``; or
                ``inputs_embeds`` ``(B, T, d_model)`` in ``kwargs`` (not both).
            attention_mask: ``(B, T_past + T)``, 1 at tokens, 0 at padding (left or right), or ``None``.
            position_ids: ``(B, T)`` integer positions; default: from ``attention_mask``, else ``T_past`` onwards.
            cache: a ``transformers`` ``Cache`` to read and extend (``use_cache``, default ``config.use_cache``:
                a new ``DynamicCache`` when ``None``).
            labels: the unshifted target ids ``(B, T)`` (``-100`` ignored), or ``None``; ``num_items_in_batch``,
                ``shift_labels`` and ``ignore_index`` in ``kwargs`` as ``transformers``' ``ForCausalLMLoss``.
            logits_to_keep: the last ``n`` positions (0 = all), or a 1-D integer tensor of positions.
            **kwargs: also ``output_hidden_states``, ``return_dict``.

        Returns:
            ``CausalLMOutputWithPast``: ``logits`` ``(B, T_kept, vocab_size)`` in the parameters' dtype, ``loss`` (a
            scalar, mean next-token cross-entropy in nats, or the sum over ``num_items_in_batch``; ``None`` without
            labels), ``cache`` (with ``use_cache``), ``hidden_states`` (with ``output_hidden_states``); a tuple with
            ``return_dict=False``.

        Raises:
            TypeError, ValueError: naming the argument: labels of another shape, a floating dtype or ids out of
                range, labels with a ``logits_to_keep`` that drops positions
                (:func:`~coupled_qk.hf.inputs.check_labels`), and the input errors listed in the class docstring.
        """
        shift = kwargs.get("shift_labels")
        embeds = kwargs.get("inputs_embeds")
        if input_ids is not None:
            check_labels(labels, input_ids, self.config.vocab_size, logits_to_keep, shift)  # (no ids: run_gpt)
        elif isinstance(embeds, torch.Tensor) and embeds.dim() == 3:  # targets of the embedded tokens
            check_labels(labels, embeds[..., 0], self.config.vocab_size, logits_to_keep, shift, "inputs_embeds")
        hidden, cache, use_cache, states = run_gpt(
            self, input_ids, attention_mask, position_ids, cache, use_cache, kwargs
        )
        if isinstance(logits_to_keep, torch.Tensor):  # the positions to keep (as transformers' models)
            hidden = hidden[:, logits_to_keep.to(hidden.device)]
        elif logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        logits = self.model.logits(hidden)  # vocab_size columns (a padded head's extra rows dropped)
        loss = None
        if labels is not None:
            loss_kwargs = {k: kwargs[k] for k in ("num_items_in_batch", "shift_labels", "ignore_index") if k in kwargs}
            if shift is not None:  # integer targets of any dtype (check_labels): cross_entropy takes int64 only
                loss_kwargs["shift_labels"] = shift.long()
            loss = self.loss_function(
                logits=logits, labels=labels.long(), vocab_size=self.config.vocab_size, **loss_kwargs
            )
        out = CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache if use_cache else None, hidden_states=states)
        return as_output(self, out, kwargs)

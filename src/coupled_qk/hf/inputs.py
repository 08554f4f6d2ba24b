"""Argument checks of the Hugging Face wrappers (:mod:`coupled_qk.hf.modeling`): the model folder of
``from_pretrained``, the cache, the forward inputs and labels, and ``generate``'s arguments. Each names the
argument it refuses; :meth:`coupled_qk.GPT.hidden_states` checks the ids' range, the mask and the positions."""

from __future__ import annotations

import difflib
from pathlib import Path

import torch
from transformers.cache_utils import Cache
from transformers.utils import CONFIG_NAME

from coupled_qk.checks.tensors import check_generate_args, check_ids
from coupled_qk.hf.hints import run_folder_hint


def check_folder(path: Path) -> None:
    """``FileNotFoundError`` for a local folder that is not a Hugging Face model folder (a hub name passes)."""
    if not path.is_dir():
        return
    hint = run_folder_hint(path)
    if hint is not None:
        raise FileNotFoundError(hint)
    if not (path / CONFIG_NAME).is_file():
        raise FileNotFoundError(
            f"{path} has no config.json, so it is not a Hugging Face model folder; write one "
            "with save_pretrained() or `coupled-qk export RUN_DIR HF_DIR`"
        )


def check_saved_files(path: Path) -> None:
    """The files ``from_pretrained`` reads from the local folder ``path``, checked before it reads them, so that a
    damaged one is named: each ``*.safetensors`` must open (its header parse and cover the file: a file cut short
    by a full disk or an interrupted copy failed inside ``safetensors`` as "incomplete metadata, file not fully
    covered", naming no file); ``model.safetensors.index.json`` must be JSON naming shards that exist; a damaged
    ``generation_config.json`` (which ``transformers`` skips, generating with the model config's settings) is a
    warning naming it.

    Raises:
        ValueError: naming the damaged file, its size and what to do.
    """
    import json
    import warnings

    from safetensors import safe_open

    if not path.is_dir():
        return
    remedy = f"export the run again (coupled-qk export RUN {path} --overwrite) or restore the file"
    for weights in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(weights), "pt"):
                pass
        except Exception as exc:  # safetensors' own error type and message
            raise ValueError(
                f"{weights} is damaged or cut short ({weights.stat().st_size:,} bytes; safetensors: {exc}); {remedy}"
            ) from None
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(
                f"{index} is not a weight index (a JSON object with a weight_map; {exc}); {remedy}"
            ) from None
        missing = sorted(s for s in shards if not (path / s).is_file())
        if missing:
            raise ValueError(f"{index} names weight files that are not in {path}: {missing}; {remedy}")
    generation = path / "generation_config.json"
    if generation.is_file():
        try:
            json.loads(generation.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            warnings.warn(
                f"{generation} is not valid JSON ({exc}): transformers skips it, so generate uses the settings of "
                "config.json (its special token ids); write it again or delete it",
                UserWarning,
                stacklevel=3,
            )


def cache_arg(cache: Cache | None, kwargs: dict) -> Cache | None:
    """The forward's cache: ``cache``, else ``kwargs["past_key_values"]`` (popped; the name before ``transformers``
    5.x renamed it to ``cache``), else ``None``.

    Raises:
        ValueError: not a ``transformers`` ``Cache``, naming the argument as given; a tuple or list (the legacy
            per-layer ``(key, value)`` pairs, which this ``transformers`` no longer takes) with the conversion.
    """
    legacy = kwargs.pop("past_key_values", None)
    name, cache = ("past_key_values", legacy) if cache is None else ("cache", cache)
    if cache is not None and not isinstance(cache, Cache):
        hint = (
            f"; legacy (key, value) pairs per layer: pass DynamicCache({name})"
            if isinstance(cache, (tuple, list))
            else ""
        )
        raise ValueError(f"{name} must be a transformers Cache (e.g. DynamicCache); got {type(cache).__name__}{hint}")
    return cache


def check_cache_batch(cache: Cache | None, batch: int) -> None:
    """A ``transformers`` cache that already holds keys must hold ``batch`` sequences (its first layer's keys
    ``(B, H, T, d)``), else ``ValueError`` naming both sizes (torch's own error names neither)."""
    layers = getattr(cache, "layers", None)
    keys = getattr(layers[0], "keys", None) if layers else None
    if isinstance(keys, torch.Tensor) and keys.dim() == 4 and keys.shape[0] != batch:
        raise ValueError(
            f"the cache holds {keys.shape[0]} sequences but input_ids has {batch} rows; continue each "
            "cache with its own batch (or pass a new cache)"
        )


def check_inputs(
    input_ids: torch.Tensor | None, kwargs: dict, use_cache=None, d_model: int | None = None, device=None
) -> None:
    """The forward arguments that :meth:`coupled_qk.GPT.hidden_states` does not check itself (it checks
    ``input_ids``, ``attention_mask`` and ``position_ids``), once per call: exactly one of ``input_ids`` (a
    ``(B, T)`` integer tensor, named ``input_ids`` in messages) and ``kwargs["inputs_embeds"]``
    (:func:`check_embeds`, ``d_model`` and ``device`` the model's), and
    ``use_cache``/``output_hidden_states``/``return_dict`` ``None`` or a bool.

    Raises:
        ValueError: both or neither of ``input_ids`` and ``inputs_embeds``, either of a wrong shape or dtype.
        TypeError: a non-tensor ``input_ids`` or ``inputs_embeds``; a flag that is not a bool, naming it (the
            string ``"False"`` would otherwise be read as true); a misspelt keyword (:func:`check_keywords`).
    """
    embeds = kwargs.get("inputs_embeds")
    if embeds is not None:
        if input_ids is not None:
            raise ValueError("pass either input_ids or inputs_embeds, not both (got both)")
        check_embeds(embeds, d_model, device)
    elif input_ids is None:
        raise ValueError("input_ids (LongTensor of shape (B, T)) or inputs_embeds ((B, T, d_model)) is required")
    else:
        check_ids("input_ids", input_ids)  # kind, rank, dtype and sizes, named as here; the ids' range: GPT.embed
    check_keywords(kwargs)
    for name, value in (
        ("use_cache", use_cache),
        ("output_hidden_states", kwargs.get("output_hidden_states")),
        ("output_attentions", kwargs.get("output_attentions")),  # "False" was read as asking for them
        ("return_dict", kwargs.get("return_dict")),
    ):
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"{name}={value!r} must be True, False or None")


# The forwards' own arguments and those the ecosystem passes (generate, Trainer, peft): other keywords are ignored
# as GPT-2's forward ignores them, except a near-miss of one of these, which is a typo that would take no effect.
FORWARD_KEYWORDS = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "cache",
    "past_key_values",
    "use_cache",
    "labels",
    "logits_to_keep",
    "inputs_embeds",
    "output_hidden_states",
    "output_attentions",
    "return_dict",
    "shift_labels",
    "num_items_in_batch",
    "cache_position",
    "token_type_ids",
)


def check_keywords(kwargs: dict) -> None:
    """The forwards' extra keywords (``**kwargs``): a name within a typo of one of :data:`FORWARD_KEYWORDS`
    (``atention_mask``, ``label``) is refused, since it would be ignored silently; ``token_type_ids`` must be
    ``None`` or all zeros (the model has no token-type embeddings, GPT-2 adds them: nonzero types would be
    dropped without a word). Other names pass (ignored, as by GPT-2's forward).

    Raises:
        TypeError: a near-miss keyword, naming it and the argument it resembles.
        ValueError: nonzero ``token_type_ids``.
    """
    for key in kwargs:
        if key in FORWARD_KEYWORDS:
            continue
        close = difflib.get_close_matches(key, FORWARD_KEYWORDS, n=1, cutoff=0.8)
        if close:
            raise TypeError(
                f"forward() got an unexpected keyword argument {key!r} (it would be ignored); did you "
                f"mean {close[0]!r}?"
            )
    types = kwargs.get("token_type_ids")
    if isinstance(types, torch.Tensor) and bool(types.ne(0).any()):
        raise ValueError(
            "token_type_ids must be None or all zeros: this model has no token-type embeddings (the "
            "nonzero types would be ignored); drop them from the inputs"
        )


def check_embeds(embeds, d_model: int | None, device=None) -> None:
    """``inputs_embeds``: a floating tensor ``(B, T, d_model)`` with ``B, T >= 1``, on ``device`` (the model's;
    ``None`` or meta: not checked), e.g. ``model.get_input_embeddings()(input_ids)``.

    Raises:
        TypeError: not a tensor. ValueError: naming ``inputs_embeds``: another shape, a zero-sized dimension, a
            non-floating dtype, another device.
    """
    if not isinstance(embeds, torch.Tensor):
        raise TypeError(f"inputs_embeds must be a torch.Tensor of shape (B, T, d_model); got {type(embeds).__name__}")
    if embeds.dim() != 3 or (d_model is not None and embeds.shape[-1] != d_model) or 0 in embeds.shape[:2]:
        raise ValueError(
            f"inputs_embeds must have shape (B, T, d_model={d_model}) with B, T >= 1; got {tuple(embeds.shape)}"
        )
    if not embeds.dtype.is_floating_point:
        raise ValueError(
            f"inputs_embeds must be a floating tensor (token embeddings, e.g. "
            f"model.get_input_embeddings()(input_ids)); got dtype {embeds.dtype}"
        )
    if device is not None and torch.device(device).type != "meta" and embeds.device != torch.device(device):
        raise ValueError(f"inputs_embeds is on {embeds.device} but the model is on {device}")


def check_labels(
    labels, input_ids: torch.Tensor, vocab_size: int, logits_to_keep, shift_labels=None, inputs: str = "input_ids"
) -> None:
    """``labels`` and ``shift_labels`` (each ``None`` or an integer tensor of ``input_ids``' shape ``(B, T)``, ids in
    ``[0, vocab_size)`` or ``-100``; values checked on CPU tensors only, to avoid a device sync) and
    ``logits_to_keep``: an int ``>= 0`` (the last ``n`` positions, ``0``: all) or, as in ``transformers``, a
    1-D integer tensor of the positions to keep (in ``[-T, T)``). A loss needs the logits of every position, so
    ``labels``/``shift_labels`` with a ``logits_to_keep`` that drops some are refused (``transformers`` failed
    there with a batch-size mismatch naming neither).

    Raises:
        TypeError: a non-tensor ``labels`` / ``shift_labels``, a ``logits_to_keep`` neither an int nor a tensor.
        ValueError: naming the argument: a shape other than ``input_ids``', a floating dtype, an id out of range,
            a negative ``logits_to_keep``, a ``logits_to_keep`` tensor not 1-D integer or with a position out of
            range, targets with a ``logits_to_keep`` that drops positions.

    ``inputs``: what messages call the input (``"inputs_embeds"``: ``input_ids`` is then ``inputs_embeds[..., 0]``).
    """
    t = input_ids.shape[-1] if isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 else None
    if isinstance(logits_to_keep, torch.Tensor):
        _check_positions_to_keep(logits_to_keep, t)
    elif isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, int):
        raise TypeError(
            f"logits_to_keep={logits_to_keep!r} must be an int (0: all positions) or a 1-D tensor of positions"
        )
    elif logits_to_keep < 0:
        raise ValueError(f"logits_to_keep={logits_to_keep} must be >= 0 (0: all positions)")
    drops = isinstance(logits_to_keep, torch.Tensor) or (t is not None and 0 < logits_to_keep < t)
    for name, value in (("labels", labels), ("shift_labels", shift_labels)):
        if value is not None:
            _check_targets(name, value, input_ids, vocab_size, inputs)
            if drops:
                kept = (
                    f"{tuple(logits_to_keep.shape)} positions"
                    if isinstance(logits_to_keep, torch.Tensor)
                    else f"the last {logits_to_keep} of {t} positions"
                )
                raise ValueError(
                    f"{name} need the logits of every position, but logits_to_keep keeps {kept}; "
                    "pass logits_to_keep=0 with labels"
                )


def _check_positions_to_keep(keep: torch.Tensor, t: int | None) -> None:
    """A ``logits_to_keep`` tensor: 1-D integer positions in ``[-t, t)`` (values checked on CPU only)."""
    if keep.dim() != 1 or keep.dtype.is_floating_point or keep.dtype == torch.bool or keep.is_complex():
        raise ValueError(
            f"logits_to_keep as a tensor must be 1-D integer positions; got {keep.dtype} {tuple(keep.shape)}"
        )
    if (
        t is not None
        and keep.numel()
        and keep.device.type == "cpu"
        and not -t <= int(keep.min()) <= int(keep.max()) < t
    ):
        raise ValueError(
            f"logits_to_keep: positions must be in [-{t}, {t}) (the sequence has {t}); got min "
            f"{int(keep.min())}, max {int(keep.max())}"
        )


def _shape_of(inputs: str) -> str:
    return "input_ids' shape" if inputs == "input_ids" else f"{inputs}' (B, T)"


def _check_targets(name: str, labels, input_ids: torch.Tensor, vocab_size: int, inputs: str) -> None:
    """One target tensor of :func:`check_labels`, named ``name`` in messages."""
    how = "unshifted: the model shifts them" if name == "labels" else "already shifted, -100 at the last position"
    if not isinstance(labels, torch.Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor of token ids of {_shape_of(inputs)}; got {type(labels).__name__}"
        )
    if labels.shape != input_ids.shape:
        raise ValueError(
            f"{name} has shape {tuple(labels.shape)}; expected {_shape_of(inputs)} {tuple(input_ids.shape)} ({how})"
        )
    if labels.dtype.is_floating_point or labels.dtype == torch.bool or labels.is_complex():
        raise ValueError(f"{name} must hold integer token ids; got dtype {labels.dtype}")
    if labels.numel() and labels.device.type == "cpu":
        real = labels[labels != -100]
        if real.numel() and (int(real.min()) < 0 or int(real.max()) >= vocab_size):
            raise ValueError(
                f"{name}: token ids must be in [0, {vocab_size}) or -100 (ignored); got min "
                f"{int(real.min())}, max {int(real.max())}"
            )


def check_hf_generate_args(ids, model_config, config, kwargs: dict, device) -> None:
    """The arguments of :meth:`coupled_qk.hf.modeling.CoupledQKForCausalLM.generate` (``ids`` the prompt,
    ``model_config`` the model's :class:`~coupled_qk.hf.configuration.CoupledQKConfig`, ``config`` the
    ``GenerationConfig`` in use, ``kwargs`` the call's keywords): ``max_new_tokens`` (or what ``max_length``
    leaves), the beam counts, and :func:`~coupled_qk.checks.tensors.check_generate_args`'s checks. A prompt
    given as ``kwargs["inputs_embeds"]`` ``(B, T, d_model)`` (with or without ``ids``, which must then be its
    ``(B, T)`` token ids) is checked by :func:`check_embeds` and its length counts as the prompt's.

    Raises:
        TypeError, ValueError: naming the argument.
    """
    prompt = "input_ids"  # what the messages call the prompt
    if ids is not None:
        check_ids(prompt, ids, vocab_size=model_config.vocab_size)
    embeds = kwargs.get("inputs_embeds")
    if embeds is not None:
        check_embeds(embeds, model_config.d_model, device)
        if ids is None:  # the prompt's (B, T) for the checks below: the embeddings stand for its tokens
            ids, prompt = torch.zeros(embeds.shape[:2], dtype=torch.long, device=embeds.device), "inputs_embeds"
        elif tuple(ids.shape) != tuple(embeds.shape[:2]):
            raise ValueError(
                f"input_ids has shape {tuple(ids.shape)} but inputs_embeds {tuple(embeds.shape)}: "
                "with both, input_ids must be the (B, T) token ids of the embedded prompt"
            )
    new = kwargs.get("max_new_tokens", config.max_new_tokens)
    if new is None:
        new = _new_from_max_length(
            ids.shape[1], kwargs.get("max_length", config.max_length), "max_length" in kwargs, model_config.block_size
        )
    _check_special_ids(config, kwargs, model_config.vocab_size)
    for name in ("num_beams", "num_return_sequences", "num_beam_groups"):  # transformers divides by them
        value = kwargs.get(name)  # None given: transformers failed comparing it ("'>' not supported ...")
        if (value is not None or (name in kwargs and name != "num_beam_groups")) and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise (TypeError if not isinstance(value, int) or isinstance(value, bool) else ValueError)(
                f"{name}={value!r} must be an int >= 1 (or left out: the generation config's)"
            )
    given = {k: kwargs[k] for k in ("temperature", "top_k", "top_p", "repetition_penalty") if kwargs.get(k) is not None}
    check_generate_args(
        ids,
        new,
        block_size=model_config.block_size,
        vocab_size=model_config.vocab_size,
        use_cache=True if kwargs.get("use_cache") is None else kwargs["use_cache"],  # None: default
        attention_mask=kwargs.get("attention_mask"),
        device=device,
        name=prompt,
        **given,
    )


def _new_from_max_length(t: int, max_length, given: bool, block_size: int) -> int:
    """The number of tokens ``generate`` makes after a prompt of ``t`` tokens without ``max_new_tokens``: up to
    ``max_length`` in all (``given`` by the caller, else the generation config's), or, neither set, 20 new tokens
    within the context (``transformers``' default, which caps ``max_length`` at ``max_position_embeddings``).

    Raises:
        TypeError: a ``max_length`` that is not an int (``None`` given). ValueError: a ``max_length`` beyond
            ``block_size``.
    """
    if max_length is None and given:  # transformers failed on it ("unsupported operand type(s) for +")
        raise TypeError("max_length=None: pass an int, or max_new_tokens, or leave both out (20 new tokens)")
    if max_length is None:
        return max(0, min(t + 20, block_size) - t)
    if isinstance(max_length, bool) or not isinstance(max_length, int):
        raise TypeError(f"max_length={max_length!r} must be an int")
    new = max(0, max_length - t)
    if t + new > block_size:
        origin = "" if given else " (the generation config's; pass max_new_tokens)"
        raise ValueError(
            f"max_length={max_length}{origin} exceeds block_size={block_size}: prompt length {t} + "
            f"{new} new tokens would not fit the model's context"
        )
    return new


def _check_special_ids(config, kwargs: dict, vocab_size: int) -> None:
    """``pad_token_id`` and ``eos_token_id`` in effect for ``generate`` (the call's, else the generation config's):
    ``None`` or ids in ``[0, vocab_size)`` (``eos_token_id`` may be a list). An out-of-vocabulary pad id failed
    mid-generation, once a row had finished, with an error about token ids that named neither; an
    out-of-vocabulary end id silently never stopped generation.

    Raises:
        TypeError: an id that is not an int. ValueError: an id outside ``[0, vocab_size)``, naming the argument.
    """
    for name in ("pad_token_id", "eos_token_id"):
        value = kwargs[name] if name in kwargs else getattr(config, name, None)
        if value is None:
            continue
        values = value.tolist() if isinstance(value, torch.Tensor) else value
        for v in values if isinstance(values, (list, tuple)) else [values]:
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name}={value!r} must be an int token id (or None)")
            if not 0 <= v < vocab_size:
                raise ValueError(
                    f"{name}={value!r} is not a token id of this model: ids are in [0, {vocab_size}) "
                    "(set it in the call or in model.generation_config)"
                )

"""Loading a model that :func:`coupled_qk.hf.retrofit` retrofitted and ``save_pretrained`` saved.

:func:`load_retrofitted` rebuilds it from the folder; :func:`restore_retrofit` gives a plain ``from_pretrained`` of
the folder (which keeps only the base weights) its coupling back. Both retrofit again with every option recorded in
``config.json``'s ``coupled_qk_retrofit`` entry (the map, its options, the layers, ``freeze_base``, ...).
"""

from __future__ import annotations

import torch.nn as nn

from coupled_qk.hf.retrofit import RETROFIT_KEY, retrofit
from coupled_qk.hf.retrofit_maps import OPTION_NAMES


def load_retrofitted(path, **kwargs) -> nn.Module:
    """Load a model saved with ``save_pretrained`` after :func:`retrofit` (options from its ``config.json``).

    ``kwargs`` go to ``from_pretrained`` of the folder's ``AutoModelForCausalLM`` class. The base weights load
    first (``transformers`` is told to expect the ``qk_dynamics`` entries, so its load report does not list them
    as unexpected; any other unexpected or missing weight is still reported), the model is retrofitted with the
    saved options and the coupling parameters are read from the same safetensors files.

    Raises:
        ValueError: the folder's config has no ``coupled_qk_retrofit`` entry or a malformed one (naming the folder),
            or coupling weights are missing.
    """
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    config = AutoConfig.from_pretrained(path)
    if not getattr(config, RETROFIT_KEY, None):
        raise ValueError(f"{path} holds no retrofitted model (config.json lacks '{RETROFIT_KEY}')")
    base = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    expected = [*(base._keys_to_ignore_on_load_unexpected or []), r"\.qk_dynamics\."]
    loader = type(base.__name__, (base,), {"_keys_to_ignore_on_load_unexpected": expected})
    model = loader.from_pretrained(path, config=config, **kwargs)
    model.__class__ = base  # the loader subclass only silences the report; the model is the family's own class
    return restore_retrofit(model, path)


def _retrofit_saved(model: nn.Module, options, path) -> None:
    """:func:`retrofit` with the options read from ``path``'s ``config.json``; ``ValueError`` naming the folder when
    they are not a mapping of :func:`retrofit`'s options or hold a value it refuses."""
    known = OPTION_NAMES
    if not isinstance(options, dict) or set(options) - set(known):
        extra = sorted(set(options) - set(known)) if isinstance(options, dict) else None
        raise ValueError(
            f"{path}: config.json's '{RETROFIT_KEY}' = {options!r} must map retrofit's options "
            f"{list(known)}" + (f"; unknown {extra}" if extra else "")
        )
    delattr(model.config, RETROFIT_KEY)  # retrofit refuses a model whose config has it (and writes it back)
    try:
        retrofit(model, **{**options, "dt_init": 0.0})
    except ValueError as exc:
        setattr(model.config, RETROFIT_KEY, options)
        raise ValueError(f"{path}: config.json's '{RETROFIT_KEY}': {exc}") from None


def restore_retrofit(model: nn.Module, path) -> nn.Module:
    """Retrofit ``model``, loaded with a plain ``from_pretrained`` from the folder ``path`` that a retrofitted
    model was saved to, with the saved options, and read its coupling weights from the folder's safetensors
    files (such a load keeps only the base weights: ``transformers`` reports the coupling ones as unexpected and
    drops them). Folders saved from a base model (``GPT2Model``, ``LlamaModel``) load into the causal LM.

    Returns:
        ``model``, retrofitted in place, with the saved ``dt`` and coupling network.

    Raises:
        ValueError: ``model.config`` has no ``coupled_qk_retrofit`` entry or a malformed one (naming the folder),
            ``model`` is already retrofitted, or the folder lacks coupling weights (naming the first ones).
    """
    from pathlib import Path

    from safetensors.torch import load_file

    options = getattr(getattr(model, "config", None), RETROFIT_KEY, None)
    if not options:
        raise ValueError(f"{path} holds no retrofitted model (config.json lacks '{RETROFIT_KEY}')")
    _retrofit_saved(model, options, path)
    wanted = {n for n, _ in model.named_parameters() if ".qk_dynamics." in n}
    prefix = f"{getattr(model, 'base_model_prefix', '')}."
    state = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        for k, v in load_file(str(file)).items():
            if ".qk_dynamics." in k:  # a base model's keys lack the causal LM's prefix ("transformer.", "model.")
                state[k if k in wanted or prefix + k not in wanted else prefix + k] = v
    missing = sorted(wanted - set(state))
    if missing:
        raise ValueError(f"{path} lacks coupling weights {missing[:4]}{' ...' if len(missing) > 4 else ''}")
    model.load_state_dict(state, strict=False)
    return model

"""``CoupledQKConfig``: a flat Hugging Face config whose fields are exactly the :class:`~coupled_qk.GPTConfig` ones.

Every ``GPTConfig`` field is a top-level attribute (and key of ``config.json``); edits of those keys take
effect. Construction validates them through ``GPTConfig`` (the same ``ValueError`` naming the field).
``config.json`` files written by older versions nest the fields in a ``"gpt"`` dict: they still load, with
the top-level keys taking precedence. See ``docs/METHOD.md`` section 4 (presets) for the field meanings.
"""

from __future__ import annotations

import dataclasses

from transformers import PretrainedConfig

from coupled_qk.models.config import GPTConfig

GPT_FIELDS = tuple(f.name for f in dataclasses.fields(GPTConfig) if f.name != "extra")
"""Names of the model fields (``GPTConfig`` without its free-form ``extra``)."""


class CoupledQKConfig(PretrainedConfig):
    """Hugging Face config of a coupled-qk model (``model_type = "coupled_qk"``).

    Args:
        **kwargs: any :class:`~coupled_qk.GPTConfig` field (``vocab_size``, ``block_size``, ``n_layer``,
            ``d_model``, ``n_heads``, ``attention``, ``integrator``, ...) plus the usual ``PretrainedConfig``
            keywords (``bos_token_id``, ``eos_token_id``, ``pad_token_id``, ...). Fields left out take the
            ``GPTConfig`` defaults; derived ones (``n_kv_heads``, ``d_head``, ``d_ff``) are filled in.

    Standard names map onto ours: ``num_hidden_layers -> n_layer``, ``hidden_size -> d_model``,
    ``num_attention_heads -> n_heads``, ``num_key_value_heads -> n_kv_heads``, ``head_dim -> d_head``,
    ``intermediate_size -> d_ff``, ``max_position_embeddings -> block_size``.

    Raises:
        ValueError: an invalid field value (from :class:`~coupled_qk.GPTConfig`), naming the field.
    """

    model_type = "coupled_qk"
    attribute_map = {
        "num_hidden_layers": "n_layer",
        "hidden_size": "d_model",
        "num_attention_heads": "n_heads",
        "num_key_value_heads": "n_kv_heads",
        "head_dim": "d_head",
        "intermediate_size": "d_ff",
        "max_position_embeddings": "block_size",
    }

    def __init__(self, **kwargs):
        legacy = kwargs.pop("gpt", None) or {}  # written by coupled-qk <= 0.1.0: top-level keys win
        fields = {k: legacy[k] for k in GPT_FIELDS if k in legacy}
        fields.update({k: kwargs.pop(k) for k in GPT_FIELDS if k in kwargs})
        gpt = GPTConfig(**fields)
        kwargs.setdefault("tie_word_embeddings", True)
        use_cache = bool(kwargs.pop("use_cache", True)) or bool(legacy)  # the old wrapper could not cache
        super().__init__(**kwargs)
        self.use_cache = use_cache
        for name in GPT_FIELDS:
            setattr(self, name, getattr(gpt, name))

    @classmethod
    def from_gpt_config(cls, config: GPTConfig, **kwargs) -> CoupledQKConfig:
        """The Hugging Face config of a :class:`~coupled_qk.GPTConfig` (its ``extra`` notes are dropped)."""
        return cls(**{k: getattr(config, k) for k in GPT_FIELDS}, **kwargs)

    def to_gpt_config(self) -> GPTConfig:
        """The equivalent validated :class:`~coupled_qk.GPTConfig` (``ValueError`` naming a bad field)."""
        return GPTConfig(**{k: getattr(self, k) for k in GPT_FIELDS})

"""Hugging Face ``transformers`` wrappers: ``save_pretrained`` / ``from_pretrained`` / ``generate``.

Optional: needs ``pip install "coupled-qk[hf]"``. Everything stays local (no hub access is attempted when
loading from a folder).

    from coupled_qk.models.hf import CoupledQKForCausalLM
    hf_model = CoupledQKForCausalLM.from_gpt(model)     # wrap a trained coupled_qk.GPT (weights shared)
    hf_model.save_pretrained("my-model")
    hf_model = CoupledQKForCausalLM.from_pretrained("my-model")
"""

from __future__ import annotations

import dataclasses

import torch
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from coupled_qk.models.config import GPTConfig
from coupled_qk.models.gpt import GPT
from coupled_qk.ops.losses import next_token_loss

_FIELDS = [f.name for f in dataclasses.fields(GPTConfig)]
_FLAT = list(GPTConfig._extra_names)  # flat map options of configs saved before GPTConfig.qk_map


class CoupledQKConfig(PretrainedConfig):
    """``PretrainedConfig`` holding every :class:`GPTConfig` field (``model_type = "coupled_qk"``)."""

    model_type = "coupled_qk"
    attribute_map = {"num_hidden_layers": "n_layer", "hidden_size": "d_model", "num_attention_heads": "n_heads"}

    def __init__(self, **kwargs):
        gpt = {k: kwargs.pop(k) for k in list(kwargs) if k in _FIELDS or k in _FLAT}
        self.gpt = GPTConfig.from_dict(GPTConfig._upgrade(gpt, "(Hugging Face config)")).to_dict()
        kwargs.setdefault("tie_word_embeddings", True)
        kwargs.setdefault("use_cache", False)
        super().__init__(**kwargs)
        for name, value in self.gpt.items():
            setattr(self, name, value)

    def to_gpt_config(self) -> GPTConfig:
        """The equivalent validated :class:`GPTConfig`."""
        return GPTConfig(**{k: getattr(self, k) for k in _FIELDS})


class CoupledQKForCausalLM(PreTrainedModel, GenerationMixin):
    """Causal LM wrapper around :class:`coupled_qk.GPT`.

    ``forward(input_ids (B, T), labels=None)`` returns ``CausalLMOutput(logits (B, T, vocab), loss)`` where
    ``labels`` are the *unshifted* input ids, as in Hugging Face causal LMs (positions with -100 are ignored).
    Generation recomputes the prefix at each step (no Hugging Face cache); for fast decoding use
    :meth:`coupled_qk.GPT.generate`, which keeps a KV cache.
    """

    config_class = CoupledQKConfig
    base_model_prefix = "model"
    _tied_weights_keys = {"model.lm_head.weight": "model.tok_emb.weight"}

    def __init__(self, config: CoupledQKConfig):
        super().__init__(config)
        self.model = GPT(config.to_gpt_config())
        self.post_init()

    def _init_weights(self, module):
        """Keep :class:`GPT`'s own GPT-2 initialisation."""

    @classmethod
    def from_gpt(cls, model: GPT) -> CoupledQKForCausalLM:
        """Wrap an existing model (its parameters are shared, not copied)."""
        wrapper = cls(CoupledQKConfig(**model.config.to_dict()))
        wrapper.model = model
        return wrapper

    def get_input_embeddings(self):
        return self.model.tok_emb

    def get_output_embeddings(self):
        return self.model.lm_head

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        return {"input_ids": input_ids}

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, **kwargs) -> CausalLMOutput:
        logits = self.model(input_ids)
        loss = None
        if labels is not None:
            loss = next_token_loss(logits[:, :-1], labels[:, 1:])
        return CausalLMOutput(loss=loss, logits=logits)

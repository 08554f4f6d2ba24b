"""``CoupledQKConfig``: a Hugging Face config whose fields are exactly the :class:`~coupled_qk.GPTConfig` ones.

Every ``GPTConfig`` field is a top-level attribute (and key of ``config.json``), with the query-key map's
options in the nested ``qk_map`` dict as in ``GPTConfig``; edits of those keys take effect. The flat
spellings ``GPTConfig`` accepts (``integrator``, ``n_steps``, ``dt_init``, ...) are accepted as input too.
Construction validates through ``GPTConfig`` (the same ``ValueError`` naming the field). ``config.json``
files written by coupled-qk 0.1.0 nest the fields in a ``"gpt"`` dict: they still load, with the top-level
keys taking precedence. See ``docs/METHOD.md`` section 4 for the fields.
"""

from __future__ import annotations

import contextvars
import dataclasses
import difflib
import functools

from transformers import PretrainedConfig
from transformers.utils import CONFIG_NAME

from coupled_qk.models.config import GPTConfig, fold_flat_options
from coupled_qk.models.field_rules import loading_saved, refuse_unless_saved
from coupled_qk.models.provenance import KEY as PROVENANCE_KEY
from coupled_qk.models.provenance import naming_providers, providers

GPT_FIELDS = tuple(f.name for f in dataclasses.fields(GPTConfig))
"""Names of the ``GPTConfig`` fields (stored in ``config.json``)."""


STANDARD_NAMES = {
    "num_hidden_layers": "n_layer",
    "hidden_size": "d_model",
    "num_attention_heads": "n_heads",
    "num_key_value_heads": "n_kv_heads",
    "head_dim": "d_head",
    "intermediate_size": "d_ff",
    "max_position_embeddings": "block_size",
    "rope_theta": "rope_base",
}
"""The standard ``transformers`` config names and the ``GPTConfig`` fields they stand for."""


def _standard_names_to_ours(kwargs: dict) -> dict:
    """Move standard names in ``kwargs`` to our field names, in place; return ``{our name: standard name}`` of
    those moved. ``None`` values are dropped (the default). ``ValueError`` on a conflicting pair."""
    given = {}
    for standard, ours in STANDARD_NAMES.items():
        if standard not in kwargs:
            continue
        value = kwargs.pop(standard)
        if value is None:
            continue
        if kwargs.get(ours) is not None and kwargs[ours] != value:
            raise ValueError(
                f"CoupledQKConfig got {standard}={value!r} and {ours}={kwargs[ours]!r}, which name the same field "
                f"({standard} is the transformers name of {ours}); pass only one of them"
            )
        kwargs[ours], given[ours] = value, standard
    return given


_building: contextvars.ContextVar[bool] = contextvars.ContextVar("coupled_qk_building_hf_config", default=False)
"""True while a ``CoupledQKConfig`` is being constructed (a flag in the instance would be saved in config.json)."""


def _check_tied(value) -> None:
    """``tie_word_embeddings`` must be ``True``: the model's output head *is* its token embedding
    (``models/gpt.py``), so an untied head would be left at its random initialisation when loaded."""
    if value is not True:
        raise ValueError(
            f"CoupledQKConfig.tie_word_embeddings={value!r}: coupled-qk models always tie the output "
            "head to the token embedding (an untied head would load with random weights); leave it True"
        )


FLAGS = ("use_cache", "return_dict", "output_hidden_states")
"""The config's switches that the models read as defaults of their forward arguments: each must be a bool."""


def _check_flag(name: str, value):
    """``value`` if it is a bool, else ``ValueError`` naming ``name`` (a string such as ``"false"`` in an edited
    config.json would otherwise be read as true)."""
    if not isinstance(value, bool):
        raise ValueError(f"CoupledQKConfig.{name}={value!r} must be true or false (a JSON boolean)")
    return value


COUNTERPARTS = {
    **{name: "dropout" for name in ("attention_dropout", "hidden_dropout", "resid_pdrop", "attn_pdrop", "embd_pdrop")},
    **{name: "position='rope' and rope_base" for name in ("rope_scaling", "rope_parameters", "partial_rotary_factor")},
    "n_positions": "block_size",
    "n_embd": "d_model",
    "n_head": "n_heads",
    "n_inner": "d_ff",
}
"""Names other ``transformers`` models read that have a counterpart here (not the same meaning, or not a plain
synonym: said in the message, not mapped)."""


def _refuse_unknown(kwargs: dict) -> None:
    """Refuse a keyword that is neither ours (a field, a flat map option, a standard name) nor a ``transformers``
    config attribute: ``PretrainedConfig`` keeps it as an attribute that no coupled-qk model reads
    (``CoupledQKConfig(rope_theta=500.0)`` kept 500 while the RoPE base stayed 10000; it is now the standard name of
    ``rope_base``). A near miss of one of our fields (``n_layers``) is always refused; any other unknown key is
    refused when the config is built, and warned about when a saved ``config.json`` is read (kept, as
    ``transformers`` keeps it: a newer version may have written it;
    :func:`~coupled_qk.models.field_rules.loading_saved`).

    Raises:
        ValueError: naming the key, what it would have done and our name for it where there is one.
    """
    ours = set(GPT_FIELDS) | set(GPTConfig.extra_names()) | set(STANDARD_NAMES)
    for key in kwargs:
        if key in COUNTERPARTS:  # even a transformers attribute (rope_scaling): the model reads our field instead
            if kwargs[key] is None:  # "not given", as transformers passes it
                continue
        elif key in ours or key.startswith("_") or key in _transformers_attributes() or key == PROVENANCE_KEY:
            continue
        close = difflib.get_close_matches(key, sorted(ours), n=1, cutoff=0.85)
        if close and key not in COUNTERPARTS:
            raise ValueError(
                f"CoupledQKConfig got an unknown field {key!r}; did you mean {close[0]!r}? (an unknown "
                "name would be kept as a plain attribute and change nothing)"
            )
        hint = f"; here that is {COUNTERPARTS[key]}" if key in COUNTERPARTS else ""
        refuse_unless_saved(
            f"CoupledQKConfig got {key}={kwargs[key]!r}, which no coupled-qk model reads: it would be kept as a plain "
            f"attribute and change nothing{hint} (fields: GPTConfig's, docs/METHOD.md section 4)"
        )


TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id")
"""Special token ids a config carries for ``generate`` (``GenerationConfig.from_model_config`` reads them)."""


@functools.cache
def _transformers_attributes() -> frozenset:
    """The attribute names of a default ``PretrainedConfig`` and its properties (``num_labels``): the keywords every
    transformers config takes."""
    properties = {n for n, v in vars(PretrainedConfig).items() if isinstance(v, property)}
    return frozenset(PretrainedConfig().to_dict()) | properties | set(TOKEN_IDS) | set(FLAGS) | {"tie_word_embeddings"}


def _name_standard(exc: ValueError, given: dict) -> ValueError:
    """``exc`` with the standard name added when the field it names was given under that name."""
    message = str(exc)
    for ours, standard in given.items():
        if f"GPTConfig.{ours}=" in message:
            return ValueError(f"{standard} (GPTConfig.{ours}): {message}")
    return exc


class CoupledQKConfig(PretrainedConfig):
    """Hugging Face config of a coupled-qk model (``model_type = "coupled_qk"``).

    Args:
        **kwargs: any :class:`~coupled_qk.GPTConfig` field (``vocab_size``, ``block_size``, ``n_layer``,
            ``d_model``, ``n_heads``, ``attention``, ``qk_map``, ...) or flat map option (``integrator``,
            ``n_steps``, ``dt_init``, ...) plus the usual ``PretrainedConfig``
            keywords (``bos_token_id``, ``eos_token_id``, ``pad_token_id``, ...). Fields left out take the
            ``GPTConfig`` defaults; derived ones (``n_kv_heads``, ``d_head``, ``d_ff``) are filled in.

    Standard ``transformers`` names map onto ours in both directions (keyword arguments, reading and
    assigning attributes): ``num_hidden_layers -> n_layer``, ``hidden_size -> d_model``,
    ``num_attention_heads -> n_heads``, ``num_key_value_heads -> n_kv_heads``, ``head_dim -> d_head``,
    ``intermediate_size -> d_ff``, ``max_position_embeddings -> block_size`` (:data:`STANDARD_NAMES`). A
    standard name given as ``None`` means "the default" (as in ``transformers`` configs); ``config.json`` stores
    our names only.

    Raises:
        ValueError: an invalid field value (validated by :class:`~coupled_qk.GPTConfig`: sizes must be positive
            integers, heads must divide, ...), naming the field (and the standard name it was given as); a
            standard name and our name for the same field given with different values
            (``num_hidden_layers=2, n_layer=4``); ``use_cache``, ``return_dict`` or ``output_hidden_states`` not
            a bool.
    """

    model_type = "coupled_qk"
    attribute_map = STANDARD_NAMES

    def __init__(self, **kwargs):
        given = _standard_names_to_ours(kwargs)
        token = _building.set(True)  # the constructor's own assignments are checked as a whole, by _build
        try:
            self._build(kwargs)
        except ValueError as exc:
            raise _name_standard(exc, given) from None
        finally:
            _building.reset(token)

    def _build(self, kwargs: dict) -> None:
        legacy = kwargs.pop("gpt", None) or {}  # written by coupled-qk 0.1.0 (flat options, top-level copies)
        # the flat spellings of qk_map options (input only), generated from the registry at each call
        top = {k: kwargs.pop(k) for k in GPT_FIELDS + GPTConfig.extra_names() if k in kwargs}
        if top.get("qk_map", 0) is None:  # None means "the defaults": never let it erase given map options
            del top["qk_map"]
        fields = {**legacy, **top}  # top-level keys win
        if legacy:
            fields = GPTConfig.upgrade(fields, CONFIG_NAME)
        _refuse_unknown(kwargs)
        with naming_providers(kwargs.get(PROVENANCE_KEY)):  # a plugin's attention where it is not installed
            gpt = GPTConfig.from_dict(fields)
        if providers(gpt.attention):  # saved in config.json, for that error where the plugin is missing
            kwargs[PROVENANCE_KEY] = providers(gpt.attention)
        _check_tied(kwargs.setdefault("tie_word_embeddings", True))
        use_cache = _check_flag("use_cache", kwargs.pop("use_cache", True)) or bool(legacy)  # old: could not cache
        super().__init__(**kwargs)
        self.use_cache = use_cache
        for flag in FLAGS:
            _check_flag(flag, getattr(self, flag))
        for name, value in gpt.to_dict().items():
            setattr(self, name, value)

    def __setattr__(self, key, value) -> None:
        """Assigning a field after construction is checked as the constructor checks it (``config.attention =
        "bogus"`` is refused here, not when a saved folder fails to load): a ``GPTConfig`` field or its standard
        name is validated with the other fields and the fields derived from it follow it (``d_head`` after
        ``hidden_size``: :meth:`~coupled_qk.GPTConfig.follow`), ``tie_word_embeddings`` must
        stay ``True``, the :data:`FLAGS` must be bools; a flat map option (``config.dt_init = 0.3``) sets that option of
        ``qk_map``. ``ValueError``
        naming the field; the old value stays."""
        key = STANDARD_NAMES.get(key, key)
        if not _building.get():
            if key in FLAGS:
                _check_flag(key, value)
            elif key == "tie_word_embeddings":
                _check_tied(value)
            elif key in GPT_FIELDS:  # assigned as GPTConfig assigns it: checked, the derived fields follow it
                gpt = GPTConfig.from_dict({name: getattr(self, name) for name in GPT_FIELDS})
                setattr(gpt, key, value)
                fields = gpt.to_dict()
                for name in GPT_FIELDS:
                    if name != key and getattr(self, name) != fields[name]:
                        super().__setattr__(name, fields[name])
                value = fields[key]
            elif key in GPTConfig.extra_names():
                fields = {**{name: getattr(self, name) for name in GPT_FIELDS}, key: value}
                fold_flat_options(fields, {key})  # a change of this config's option, not the option given twice
                gpt = GPTConfig.from_dict(fields)  # validated
                key, value = "qk_map", gpt.to_dict()["qk_map"]
        super().__setattr__(key, value)

    @classmethod
    def from_gpt_config(cls, config: GPTConfig, **kwargs) -> CoupledQKConfig:
        """The Hugging Face config of a :class:`~coupled_qk.GPTConfig`; ``kwargs`` as the constructor."""
        return cls(**config.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        """A saved ``config.json`` (``from_pretrained``): a field that its settings do not read, at a non-default
        value (saved before such values were refused, ``models/field_rules.py``), warns instead of failing."""
        with loading_saved(CONFIG_NAME):
            return super().from_dict(config_dict, **kwargs)

    def to_gpt_config(self) -> GPTConfig:
        """The equivalent validated :class:`~coupled_qk.GPTConfig` (``ValueError`` naming a bad field; a field
        that its settings do not read warns, as this config was validated when made or loaded as saved)."""
        with loading_saved("CoupledQKConfig"):
            return GPTConfig.from_dict({k: getattr(self, k) for k in GPT_FIELDS})

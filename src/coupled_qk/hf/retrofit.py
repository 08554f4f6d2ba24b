"""Retrofit coupled query-key dynamics into an existing Hugging Face ``transformers`` causal LM.

``retrofit(model)`` adds a :class:`coupled_qk.QKDynamics` module (``qk_dynamics``) to every self-attention
module of a Llama, Mistral, Qwen2, Qwen3 or GPT-2 model (or to the ``layers`` chosen) and switches that module's
forward to one that evolves each token's query and key jointly before scoring (docs/METHOD.md section 1). With
``dt_init=0`` (the default) the dynamics are an exact identity, so the retrofitted model computes the same logits
as before; training then learns ``dt`` and the coupling network (only those with ``freeze_base=True``). Any other
registered query-key map works the same way (``qk_map=``, ``map_options=``) when its class says how to start at
the identity (``start_at_identity()``, verified numerically; :mod:`coupled_qk.hf.retrofit_maps`).

Where the dynamics go (the hook). Wrapping the q/k projections cannot express the method: the key update
``k' = k + dt f(q)`` needs the query of the same token and head. So the attention module keeps its weights
and class but its ``forward`` is replaced, per instance, by a copy of the ``transformers`` 5.x forward of
its family with one added line (``q, k = couple(q, k)``) between the projections (and Qwen3's q/k norms)
and the rotary embedding (``position="pre_rope"``, the default, as in our own model) or right after it
(``"post_rope"``). Everything after it is the family's own code path: the cache update, the attention
backend chosen by ``config._attn_implementation`` (eager, sdpa, flex, flash) and the output projection.
The dt=0 equality tests against the unmodified model guard this copy against drift in ``transformers``.

Caching. The dynamics act on each token separately, so the cache simply stores the *evolved* (and rotated)
keys: cached decoding with ``generate`` is exact.

Grouped-query attention (``n_kv_heads < n_heads``, group size ``r = n_heads / n_kv_heads``): the evolved
key depends on the query, so with ``gqa="expand"`` (default) every query head gets its own evolved key
(the keys are repeated to ``n_heads`` before the dynamics; one ``dt`` per query head). This is the paper's
method applied per query head; it multiplies the key cache by ``r`` (the value cache is unchanged; values
are repeated after the cache) and needs a dynamic cache (the default of ``generate``; static caches are
refused). ``gqa="shared"`` keeps one key per group: the pair (group-mean query, key) follows the paper's
dynamics, with one ``dt`` per key head, and every query head of the group receives the same displacement
as the mean query: ``q_h' = q_h + (Q(M(q), k) - M(q))``, ``k' = K(M(q), k)`` for the map ``(Q, K)`` and the group
mean ``M``. That is the map's own query update of each head (exact, for any ``n_steps``) when the update is a
shift independent of the query, as for all three integrators (``q' = q + dt k``, the key driven by ``M(q)``); a
map declares it with the class attribute ``query_update_is_shift`` (:mod:`coupled_qk.layers.qk_maps`), and
``gqa="shared"`` refuses any other map (e.g. ``query_mlp``, ``invertible``) when ``r > 1``. The cache then keeps
its original size and any cache class works. For ``r = 1`` both options are the paper's method.

Saving: the dynamics' parameters are ordinary parameters (``...self_attn.qk_dynamics.dt``,
``...qk_dynamics.force.w_in``/``w_out``), and every option is recorded in ``model.config.coupled_qk_retrofit``;
:func:`~coupled_qk.hf.retrofit_load.load_retrofitted` rebuilds such a model from a ``save_pretrained`` folder. A
plain ``from_pretrained`` of that folder keeps only the base weights (the coupling ones are reported as unexpected
and dropped); :func:`~coupled_qk.hf.retrofit_load.restore_retrofit` gives such a model its coupling back (the
lm-eval entry point does so).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Sequence

import torch
import torch.nn as nn

from coupled_qk.checks.values import choice, declared_flags
from coupled_qk.hf.retrofit_maps import DYNAMICS, build_map, check_layers, check_shared_keys, map_spec
from coupled_qk.layers.qk_maps import QKMap

GQA_MODES = ("expand", "shared")
POSITIONS = ("pre_rope", "post_rope")
RETROFIT_KEY = (
    "coupled_qk_retrofit"  # the config.json entry holding retrofit's options (read by load_retrofitted, lm-eval)
)


def _repeat_heads(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """``(B, G, T, d) -> (B, G * n_rep, T, d)``, head ``h`` taken from group ``h // n_rep`` (as ``repeat_kv``)."""
    if n_rep == 1:
        return x
    b, g, t, d = x.shape
    return x[:, :, None].expand(b, g, n_rep, t, d).reshape(b, g * n_rep, t, d)


def couple(module: nn.Module, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Evolve queries ``q (B, H, T, d)`` and keys ``k (B, G, T, d)`` with ``module.qk_dynamics``.

    Returns ``(q', k')`` with ``q'`` of shape ``(B, H, T, d)`` and ``k'`` of shape ``(B, H, T, d)``
    (``gqa="expand"``) or ``(B, G, T, d)`` (``"shared"``), same dtype as the inputs. See the module docstring.
    """
    n_rep = q.shape[1] // k.shape[1]
    if module.coupled_qk_gqa == "expand" or n_rep == 1:
        return module.qk_dynamics(q, _repeat_heads(k, n_rep))
    b, h, t, d = q.shape
    q_mean = q.view(b, h // n_rep, n_rep, t, d).mean(dim=2)
    q_mean_new, k_new = module.qk_dynamics(q_mean, k)
    shift = (q_mean_new - q_mean)[:, :, None].expand(b, h // n_rep, n_rep, t, d).reshape(b, h, t, d)
    return q + shift, k_new


def _check_cache(module: nn.Module, cache) -> None:
    if module.coupled_qk_expanded and cache is not None and getattr(cache, "is_compileable", False):
        raise ValueError(
            f"retrofit(gqa='expand') stores one evolved key per query head, which a static cache "
            f"({type(cache).__name__}) cannot hold; use the default dynamic cache or retrofit with gqa='shared'"
        )


def _values(module: nn.Module, v: torch.Tensor) -> torch.Tensor:
    """Values repeated to the query heads when keys were expanded (the attention backends then see MHA)."""
    return _repeat_heads(v, module.coupled_qk_rep) if module.coupled_qk_expanded else v


def _rope_forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs):
    """Forward of Llama/Mistral/Qwen2/Qwen3 attention (transformers 5.x) with the coupling inserted."""
    if cache is None:
        cache = kwargs.pop("past_key_values", None)
    _check_cache(self, cache)
    fam = sys.modules[type(self).__module__]
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    q = self.q_proj(hidden_states).view(hidden_shape)
    k = self.k_proj(hidden_states).view(hidden_shape)
    if self.coupled_qk_family.qk_norm:
        q, k = self.q_norm(q), self.k_norm(k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    v = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    cos, sin = position_embeddings
    if self.coupled_qk_position == "pre_rope":
        q, k = couple(self, q, k)
    q, k = fam.apply_rotary_pos_emb(q, k, cos, sin)
    if self.coupled_qk_position == "post_rope":
        q, k = couple(self, q, k)
    if cache is not None:
        k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
    v = _values(self, v)
    interface: Callable = fam.ALL_ATTENTION_FUNCTIONS.get_interface(
        self.config._attn_implementation, fam.eager_attention_forward
    )
    extra = self.coupled_qk_family.extra_kwargs(self)
    out, weights = interface(
        self, q, k, v, attention_mask,
        dropout=0.0 if not self.training else self.attention_dropout,
        scaling=self.scaling, **extra, **kwargs,
    )  # fmt: skip
    out = out.reshape(*input_shape, -1).contiguous()
    return self.o_proj(out), weights


def _gpt2_forward(
    self, hidden_states, cache=None, attention_mask=None, encoder_hidden_states=None,
    encoder_attention_mask=None, output_attentions=False, **kwargs,
):  # fmt: skip
    """Forward of GPT-2 self-attention (transformers 5.x) with the coupling inserted (GPT-2 has no RoPE)."""
    if encoder_hidden_states is not None:
        raise ValueError("a retrofitted GPT-2 attention is self-attention only; got encoder_hidden_states")
    if cache is None:
        cache = kwargs.pop("past_key_values", None)
    fam = sys.modules[type(self).__module__]
    if cache is not None and isinstance(cache, fam.EncoderDecoderCache):
        cache = cache.self_attention_cache
    q, k, v = self.c_attn(hidden_states).split(self.split_size, dim=2)
    shape = (*q.shape[:-1], -1, self.head_dim)
    q, k, v = (x.view(shape).transpose(1, 2) for x in (q, k, v))
    q, k = couple(self, q, k)
    if cache is not None:
        k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
    if self.config._attn_implementation == "eager" and self.reorder_and_upcast_attn:
        out, weights = self._upcast_and_reordered_attn(q, k, v, attention_mask)
    else:
        interface: Callable = fam.ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, fam.eager_attention_forward
        )
        out, weights = interface(
            self, q, k, v, attention_mask,
            dropout=self.attn_dropout.p if self.training else 0.0, scaling=self.scaling, **kwargs,
        )  # fmt: skip
    out = out.reshape(*out.shape[:-2], -1).contiguous()
    return self.resid_dropout(self.c_proj(out)), weights


class _Family:
    """How to retrofit one attention class: its forward, head counts and backend keyword arguments."""

    def __init__(self, forward, qk_norm=False, rope=True, extra_kwargs=lambda m: {}):
        self.forward, self.qk_norm, self.rope, self.extra_kwargs = forward, qk_norm, rope, extra_kwargs

    def heads(self, module: nn.Module) -> tuple[int, int, int]:
        """``(n_heads, n_kv_heads, d_head)`` of ``module``."""
        if not self.rope:
            return module.num_heads, module.num_heads, module.head_dim
        c = module.config
        return c.num_attention_heads, c.num_key_value_heads, module.head_dim


# module path, class name -> family (exact classes only: the copied forward is only right for these)
_FAMILIES = {
    ("transformers.models.llama.modeling_llama", "LlamaAttention"): _Family(_rope_forward),
    ("transformers.models.mistral.modeling_mistral", "MistralAttention"): _Family(
        _rope_forward, extra_kwargs=lambda m: {"sliding_window": getattr(m.config, "sliding_window", None)}
    ),
    ("transformers.models.qwen2.modeling_qwen2", "Qwen2Attention"): _Family(
        _rope_forward, extra_kwargs=lambda m: {"sliding_window": m.sliding_window}
    ),
    ("transformers.models.qwen3.modeling_qwen3", "Qwen3Attention"): _Family(
        _rope_forward, qk_norm=True, extra_kwargs=lambda m: {"sliding_window": m.sliding_window}
    ),
    ("transformers.models.gpt2.modeling_gpt2", "GPT2Attention"): _Family(_gpt2_forward, rope=False),
}
SUPPORTED = tuple(name for _, name in _FAMILIES)


def _family(module: nn.Module) -> _Family | None:
    return _FAMILIES.get((type(module).__module__, type(module).__name__))


def _attention_modules(model: nn.Module) -> list[tuple[str, nn.Module, _Family]]:
    found = []
    for name, module in model.named_modules():
        fam = _family(module)
        if fam is not None and not getattr(module, "is_cross_attention", False):
            found.append((name, module, fam))
    return found


def _supported_attention(model: nn.Module) -> list:
    """:func:`_attention_modules` of ``model``; ``ValueError`` naming the attention-like modules it has when none
    is of a supported class."""
    found = _attention_modules(model)
    if not found:
        kinds = sorted({type(m).__name__ for m in model.modules() if "attention" in type(m).__name__.lower()})
        raise ValueError(
            f"retrofit supports attention classes {list(SUPPORTED)}; {type(model).__name__} has none "
            f"(attention-like modules found: {kinds or 'none'})"
        )
    return found


def _check_fresh(model: nn.Module) -> None:
    """``ValueError`` when ``model`` is retrofitted already or was loaded from a retrofitted folder without its
    coupling."""
    if any(hasattr(m, "qk_dynamics") for m in model.modules()):
        raise ValueError("model is already retrofitted (an attention module has qk_dynamics)")
    if getattr(getattr(model, "config", None), RETROFIT_KEY, None):
        raise ValueError(
            f"model was loaded from a retrofitted folder (its config has '{RETROFIT_KEY}') without "
            "its coupling weights; retrofitting anew would discard them: use load_retrofitted(folder) "
            "or restore_retrofit(model, folder)"
        )


def _couple_module(module: nn.Module, fam: _Family, spec: tuple, gqa: str, position: str) -> None:
    """Give one attention module its map (``spec`` from :func:`~coupled_qk.hf.retrofit_maps.map_spec`) and the
    coupled forward."""
    n_heads, n_kv, d_head = fam.heads(module)
    rep = n_heads // n_kv
    expanded = gqa == "expand" and rep > 1
    ref = module.c_attn.weight if not fam.rope else module.q_proj.weight
    module.qk_dynamics = build_map(*spec, d_head, n_heads if gqa == "expand" else n_kv, ref)
    module.coupled_qk_family = fam
    module.coupled_qk_gqa, module.coupled_qk_position = gqa, position
    module.coupled_qk_rep, module.coupled_qk_expanded = rep, expanded
    if expanded:
        module.num_key_value_groups = 1  # the backends see one (evolved) key per query head
    module.forward = types.MethodType(fam.forward, module)


@declared_flags
def retrofit(
    model: nn.Module,
    integrator: str = "euler",
    n_steps: int = 1,
    dt_init: float = 0.0,
    hidden: int | None = None,
    force: str = "mlp",
    shared_across_heads: bool = True,
    gqa: str = "expand",
    position: str = "pre_rope",
    freeze_base: bool = False,
    qk_map: str = "dynamics",
    map_options: dict | None = None,
    layers: Sequence[int] | None = None,
) -> nn.Module:
    """Insert a query-key map (by default the coupled dynamics) into the self-attention modules of ``model``, in place.

    Args:
        model: a ``transformers`` causal LM (or base model) whose attention modules are ``LlamaAttention``,
            ``MistralAttention``, ``Qwen2Attention``, ``Qwen3Attention`` or ``GPT2Attention``.
        integrator, n_steps, hidden, force, shared_across_heads: options of :class:`coupled_qk.QKDynamics`
            (docs/METHOD.md section 1; ``hidden`` defaults to the head width); ``qk_map="dynamics"`` only.
        dt_init: initial step size of every head of the dynamics; ``0.0`` (default) starts at the identity, checked
            numerically (:mod:`coupled_qk.hf.retrofit_maps`), so the model's outputs stay exactly the same.
        gqa: ``"expand"`` (one evolved key per query head; key cache grows by the group size) or
            ``"shared"`` (one evolved key per key head, driven by the group-mean query; only for a map whose
            ``query_update_is_shift`` is true, e.g. the dynamics); see the module docstring. Irrelevant when
            ``n_heads == n_kv_heads``.
        position: ``"pre_rope"`` (dynamics on the un-rotated pair, then RoPE; our default) or
            ``"post_rope"``. GPT-2 has no RoPE; either value gives the same model there.
        freeze_base: if true, only the new parameters (``dt`` and the coupling network) require gradients.
        qk_map: any registered query-key map (``coupled_qk.models.registry.QK_MAPS``, plugins included) whose class
            has ``start_at_identity()``: it is called, then the map is verified to be the exact identity.
        map_options: options of a map other than ``"dynamics"`` (fields of its options dataclass; ``None``:
            defaults).
        layers: indices of the attention layers to retrofit (``0 .. n_layers - 1``, distinct, not empty); the
            others stay standard attention. ``None`` (default): every layer.

    Returns:
        ``model`` itself, modified: each chosen attention module gains a ``qk_dynamics`` submodule (the map,
        parameters in the dtype and on the device of its query projection) and a coupled forward;
        ``model.config.coupled_qk_retrofit`` records every option above (saved with ``save_pretrained``, applied
        again by :func:`~coupled_qk.hf.retrofit_load.load_retrofitted`, ``freeze_base`` included).

    Raises:
        ValueError: the model has no supported attention module (the message names the classes found and the
            supported ones), it is already retrofitted or was loaded from a retrofitted folder without its
            coupling (use :func:`~coupled_qk.hf.retrofit_load.load_retrofitted`), ``gqa="shared"`` with grouped
            keys for a map whose query update is not a shift (``query_update_is_shift`` false: naming the map), or
            an option is invalid (``gqa``, ``position``,
            ``freeze_base``, ``layers``, ``qk_map``, ``map_options``, a map without ``start_at_identity()`` or one
            it does not make the identity, or an option rejected by the map).
    """
    choice("gqa", gqa, GQA_MODES)
    choice("position", position, POSITIONS)
    _check_fresh(model)
    found = _supported_attention(model)
    chosen = check_layers(layers, len(found))
    dynamics = dict(
        integrator=integrator,
        n_steps=n_steps,
        dt_init=dt_init,
        hidden=hidden,
        force=force,
        shared_across_heads=shared_across_heads,
    )
    spec = map_spec(qk_map, map_options, dynamics)
    for _, module, fam in (found[i] for i in chosen):  # before any module is changed
        check_shared_keys(spec[0], gqa, fam.heads(module)[0] // fam.heads(module)[1])
    for i in chosen:
        _, module, fam = found[i]
        _couple_module(module, fam, spec, gqa, position)
    options = dict(
        **dynamics, gqa=gqa, position=position, freeze_base=freeze_base, qk_map=qk_map,
        map_options=None if qk_map == DYNAMICS else spec[1], layers=None if layers is None else chosen,
    )  # fmt: skip
    if getattr(model, "config", None) is not None:
        setattr(model.config, RETROFIT_KEY, options)
    if freeze_base:
        new = {id(p) for p in coupling_parameters(model)}
        for p in model.parameters():
            p.requires_grad_(id(p) in new)
    return model


def _maps(model: nn.Module) -> list[QKMap]:
    """The maps :func:`retrofit` inserted (each attention module's ``qk_dynamics``), in module order."""
    return [m.qk_dynamics for m in model.modules() if isinstance(getattr(m, "qk_dynamics", None), QKMap)]


def coupling_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters added by :func:`retrofit` (every ``dt`` and coupling network), in module order."""
    return [p for m in _maps(model) for p in m.parameters()]


def step_sizes(model: nn.Module) -> list[torch.Tensor]:
    """Detached copies of every retrofitted layer's ``dt`` (shape ``(heads,)`` each), in layer order; a map
    without a step size (``dt`` is ``None``) gives none."""
    return [m.dt.detach().clone() for m in _maps(model) if getattr(m, "dt", None) is not None]

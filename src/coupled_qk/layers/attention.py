"""Causal self-attention: one optional query-key map and one scoring rule (docs/METHOD.md sections 1-2).

The layer knows nothing about variant names; the registry (:mod:`coupled_qk.models.registry`) builds it from a
registered (query-key map x scoring) pair. The scoring rule is standard scoring (scaled dot-product attention,
Vaswani et al. 2017: :func:`coupled_qk.layers.scoring.scaled_dot_product`, computed here) or a module following
:class:`~coupled_qk.layers.scoring.ScoringRule`, built into ``self.scorer``: the built-in Differential Attention
(:class:`~coupled_qk.layers.differential.DifferentialScoring`) or a rule registered with
:func:`coupled_qk.models.registry.register_scoring`, from inside or outside the package. :data:`SCORINGS` names
the built-in ones.

The query-key map (:class:`~coupled_qk.layers.qk_maps.QKMap`, e.g. the coupled dynamics or the uncoupled query
MLP of :mod:`coupled_qk.models.maps`) transforms the projected ``(q, k)`` before scoring, before RoPE
(``map_position="pre_rope"``, default) or after it (``"post_rope"``); with a rule that pairs sub-heads
(``head_group`` 2, Differential Attention) it acts on each query/key sub-head.

The fast path is ``torch.nn.functional.scaled_dot_product_attention``; the eager path (``impl="eager"``, or
``forward(..., record=True)``) computes the softmax explicitly in float32 and can return an
:class:`AttentionRecord` for diagnostics. Grouped-query attention: ``n_kv_heads`` divides ``n_heads``;
query head ``i`` uses key/value head ``i // (n_heads // n_kv_heads)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import torch
import torch.nn as nn

from coupled_qk.checks.values import declared_flags, finite, nonneg_int, positive_int
from coupled_qk.layers.differential import DifferentialScoring
from coupled_qk.layers.folded import FoldedProjection, fold_key, fold_projection, folded_qkv, weight_checksum
from coupled_qk.layers.kv_cache import LayerCache
from coupled_qk.layers.layer_inputs import check_layer_inputs
from coupled_qk.layers.qk_maps import QKMap
from coupled_qk.layers.scoring import ScoringFactory, ScoringRule, attention_mask_4d, scaled_dot_product
from coupled_qk.ops.heads import expand_kv
from coupled_qk.ops.rope import apply_rope

MAP_POSITIONS = ("pre_rope", "post_rope")
"""Where the query-key map acts relative to RoPE."""

SCORINGS: dict[str, type[ScoringRule] | None] = {"standard": None, "differential": DifferentialScoring}
"""The scoring rules a layer takes by name: ``standard`` (scaled dot-product attention, computed by the layer)
and ``differential`` (:class:`~coupled_qk.layers.differential.DifferentialScoring`); the registry's built-in
scoring rules (:data:`coupled_qk.models.registry.SCORING_RULES`), in this order."""


@dataclass
class AttentionRecord:
    """What one attention layer computed on one forward pass (``CausalSelfAttention.forward(record=True)``).

    All tensors are detached and cover the current call's ``T`` tokens; key tensors always have one head per
    query (sub-)head (keys of grouped-query attention are repeated, so consumers index heads alike).

    Fields:
        q, k: ``(B, H, T, d_head)`` the map's inputs (the projections, RoPE-rotated when the map acts
            after RoPE); ``None`` for a layer without a query-key map.
        q_mapped, k_mapped: ``(B, H, T, d_head)`` the map's outputs (before any RoPE that follows), or ``None``.
        attn: ``(B, H_map, T, T_k)`` float32 (or float64) attention probabilities; ``A1`` for differential
            scoring, where ``H_map = H / 2`` (a scoring rule's ``head_group`` divides the heads).
        attn2: ``A2`` (differential scoring) or ``None`` (a field a scoring rule may return, as ``lam``).
        lam: scalar tensor ``lambda`` (differential scoring) or ``None``.
        dt: the map's per-head step sizes ``(H,)`` (``None`` without a map or for a map without ``dt``).
    """

    q: torch.Tensor | None
    k: torch.Tensor | None
    q_mapped: torch.Tensor | None
    k_mapped: torch.Tensor | None
    attn: torch.Tensor
    attn2: torch.Tensor | None = None
    lam: torch.Tensor | None = None
    dt: torch.Tensor | None = None


QKMapFactory = Callable[[int, int], QKMap]
"""``(d_head, n_heads) -> query-key map module`` (see :mod:`coupled_qk.layers.qk_maps`)."""

M = TypeVar("M", bound=nn.Module)

LEGACY_STATE_KEYS = (
    ("dynamics.", "qk_map."),
    ("query_mlp.", "qk_map.mlp."),
    ("dt", "qk_map.dt"),
    *((name, f"scorer.{name}") for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2", "subln.")),
)
"""State-dict keys of earlier layouts -> today's (a key equal to the first entry, or starting with it when it ends
with ``.``): the map's parameters before it became ``qk_map``; Differential Attention's before its scoring rule
became ``scorer`` (:class:`~coupled_qk.layers.differential.DifferentialScoring`). The layer renames them when a
state dict is loaded into it; :mod:`coupled_qk.hf.modeling` does the same for ``from_pretrained``."""


MAP_RNG_SALT = 0x5EED_C0DE
"""Mixed into the seed of a query-key map's own random stream (:func:`build_with_own_rng`)."""


def build_with_own_rng(factory: Callable[[int, int], M], d_head: int, n_heads: int) -> M:
    """Build a query-key map (or a scoring rule) from ``factory(d_head, n_heads)`` with its own random stream.

    The map's initial parameters are drawn from a generator seeded by one number read from the global CPU
    stream inside :func:`torch.random.fork_rng`, so the global stream leaves this call exactly as it entered.
    Consequence (the point of it): for one seed, every weight that two attention variants have in common (the
    projections, embeddings, MLPs, norms, Differential Attention's lambdas) is drawn identically whether or
    not a map, or which map, sits in the layer, so comparisons "paired by seed" pair the initial weights too;
    the map's own parameters are a deterministic function of the same seed. Returns the factory's module.
    """
    with torch.random.fork_rng(devices=[]):
        seed = int(torch.randint(0, 2**62, (), device="cpu")) ^ MAP_RNG_SALT  # cpu: also under a meta device
        torch.manual_seed(seed)
        return factory(d_head, n_heads)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with an optional query-key map and a scoring rule.

    Args:
        d_model: model width.
        n_heads: query heads of the standard layout. A scoring rule pairing sub-heads (``head_group`` ``g`` > 1:
            Differential Attention, ``g = 2``) uses ``n_heads // g`` heads, each with ``g`` query/key sub-heads
            of width ``d_head`` and a value of width ``g d_head`` (parameter-matched, as in arXiv:2410.05258).
        n_kv_heads: key/value heads (grouped-query attention); divides ``n_heads``.
        d_head: head width.
        qk_map: ``None`` (no map), a factory ``(d_head, n_heads) -> module`` following the interface of
            :mod:`coupled_qk.layers.qk_maps` (a map class itself is one; it is called after the projections
            are created, so parameters are created and randomly initialised in a fixed order), or a map
            module built by the caller.
        scoring: a name of :data:`SCORINGS` (``"standard"``, ``"differential"``) or a :class:`ScoringRule` class
            (or factory ``(d_head, n_heads, layer_idx) -> module``), built into ``self.scorer`` (``None`` for
            standard scoring).
        layer_idx: 0-based layer index (the cache slot; given to the scoring rule, e.g. Differential
            Attention's ``lambda_init``).
        map_position: ``"pre_rope"`` (default: map on the raw projections, RoPE on the mapped pair) or
            ``"post_rope"``.
        use_rope: apply rotary embeddings (otherwise positions come from the model's embeddings).
        dropout: attention-probability dropout during training.
        impl: ``"sdpa"`` (fast) or ``"eager"``.

    Forward: ``x (B, T, d_model) -> (B, T, d_model)``; ``rope`` is ``(cos, sin)`` of shape ``(T, d_head)``
    (or ``(B, 1, T, d_head)``: positions per sequence) for the current positions, optionally with a third table
    ``signed_sin(sin)`` (:func:`coupled_qk.ops.rope.apply_rope`; the model passes it), ``cache`` a
    :class:`KVCache` to read and extend, ``key_mask`` an optional bool ``(B, T_past + T)``, False at padding
    (hidden from every query, see :func:`attention_mask_4d`). With ``record=True`` the eager path runs and the
    result is ``(y, AttentionRecord)``. ``B`` or ``T`` may be 0 (an empty output). Float ``x`` of the parameters'
    dtype (any under ``torch.autocast``) on their device; float64 stays float64 end to end. The inputs are
    checked on every call (:mod:`coupled_qk.layers.layer_inputs`: ``TypeError``/``ValueError`` naming ``x``,
    ``rope`` or ``key_mask``); a model that guarantees them sets ``layer.check_every_call = False`` (``GPT`` does).
    ``torch.jit.script`` is not supported (use ``torch.compile`` or ``torch.export``); double backward
    (``torch.autograd.grad(..., create_graph=True)`` twice) needs ``impl="eager"``: SDPA's fused kernels (the
    CPU one checked) have no second derivative.

    Single-token decoding steps (a ``cache``, ``T == 1``, gradients off) of a foldable map (the coupled
    dynamics with ``n_steps=1`` before RoPE; :mod:`coupled_qk.layers.folded`) use the map folded into the
    projection: the same function up to rounding, in two to four kernels instead of seven to twelve, checked
    against the weights once per cache. ``layer.fold_inference = False`` turns it off.

    Attributes: ``qk_map`` (the map module or ``None``), ``scorer`` (the scoring rule module, ``None`` for
    standard scoring), ``head_group`` (the rule's sub-heads per head, 1 for standard scoring),
    ``named_modules()`` (and so ``parameters()``) lists a rule with ``inline_parameter_order`` (Differential
    Attention) right after the layer and its submodules after the layer's others: the parameter order of the
    layout where the rule was the layer's own code, which optimizer states and gradient-norm sums follow.

    State dicts saved before the map became one submodule (``dynamics.*``, ``query_mlp.*``, ``dt``) or before
    Differential Attention became a scoring rule module (``lambda_*``, ``subln.*``; now under ``scorer.``) load.

    Raises:
        ValueError: unknown scoring, impl or map position, head counts that do not divide, head counts that
            the scoring rule's ``head_group`` does not divide (differential scoring with an odd head count),
            ``use_rope`` with an odd ``d_head``.
    """

    @declared_flags
    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int,
        d_head: int,
        qk_map: QKMapFactory | QKMap | None = None,
        scoring: str | ScoringFactory = "standard",
        layer_idx: int = 0,
        map_position: str = "pre_rope",
        use_rope: bool = True,
        dropout: float = 0.0,
        impl: str = "sdpa",
    ):
        super().__init__()
        for name, value in (("d_model", d_model), ("n_heads", n_heads), ("n_kv_heads", n_kv_heads), ("d_head", d_head)):
            positive_int(name, value)  # before any arithmetic on them (n_heads % n_kv_heads)
        nonneg_int("layer_idx", layer_idx)
        finite("dropout", dropout, 0, 1, hi_open=True)
        if isinstance(scoring, str) and scoring not in SCORINGS:
            raise ValueError(
                f"scoring={scoring!r} is unknown; expected one of {tuple(SCORINGS)} or a ScoringRule class"
            )
        if not isinstance(scoring, str) and not callable(scoring):
            raise ValueError(
                f"scoring={scoring!r} must be a name in {tuple(SCORINGS)} or a ScoringRule class (factory)"
            )
        if impl not in ("sdpa", "eager"):
            raise ValueError(f"impl={impl!r} is unknown; expected 'sdpa' or 'eager'")
        if map_position not in MAP_POSITIONS:
            raise ValueError(f"map_position={map_position!r}; expected one of {MAP_POSITIONS}")
        if n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads={n_kv_heads} must divide n_heads={n_heads}")
        if use_rope and d_head % 2:
            raise ValueError(
                f"use_rope=True rotates pairs of features: d_head={d_head} must be even (or use_rope=False)"
            )
        self.scoring, self.layer_idx, self.impl = scoring, layer_idx, impl
        self.n_heads, self.n_kv_heads, self.d_head = n_heads, n_kv_heads, d_head
        self.n_rep = n_heads // n_kv_heads
        self.map_position, self.use_rope, self.dropout = map_position, use_rope, dropout
        self.qkv = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * d_head, bias=False)
        self.out_proj = nn.Linear(n_heads * d_head, d_model, bias=False)
        if qk_map is not None and not isinstance(qk_map, nn.Module):
            qk_map = build_with_own_rng(qk_map, d_head, n_heads)
        # a module the caller built follows the QKMap interface (isinstance on nn.Module cannot narrow to it)
        self.qk_map = qk_map = cast("QKMap | None", qk_map)
        self.scorer = self._build_scorer(scoring, d_head, n_heads, n_kv_heads, layer_idx)
        self.head_group = getattr(self.scorer, "head_group", 1)  # query/key sub-heads per head (2: differential)
        if qk_map is not None:
            map_heads = getattr(qk_map, "n_heads", n_heads)
            if map_heads != n_heads or getattr(qk_map, "d_head", d_head) != d_head:
                raise ValueError(
                    f"qk_map acts on {map_heads} heads of width {getattr(qk_map, 'd_head', d_head)}; this layer "
                    f"has n_heads={n_heads} of width d_head={d_head}"
                )
            # shapes are guaranteed from here on: no per-call (per-token) input checks in the map
            qk_map.check_every_call = False
            if self.head_group != 1 and hasattr(qk_map, "head_group"):
                qk_map.head_group = self.head_group
        self.fold_inference = True  # decoding folds the map into the projection (layers/folded.py)
        self.check_every_call = True  # check x, rope, key_mask per call (layers/layer_inputs.py; GPT turns it off)
        self._fold: FoldedProjection | None = None
        self._register_load_state_dict_pre_hook(self._upgrade_state_dict)

    def _build_scorer(
        self, scoring: str | ScoringFactory, d_head: int, n_heads: int, n_kv_heads: int, layer_idx: int
    ) -> ScoringRule | None:
        """The scoring rule module of ``scoring`` (``None`` for standard scoring): built with its own random stream
        unless the rule says otherwise (:attr:`ScoringRule.own_random_stream`), after the projections and the map,
        so that the weights every variant shares are drawn alike for one seed.

        Raises:
            ValueError: a rule whose ``head_group`` does not divide ``n_heads`` and ``n_kv_heads``.
        """
        rule = SCORINGS[scoring] if isinstance(scoring, str) else scoring
        if rule is None:
            return None
        if getattr(rule, "own_random_stream", True):
            scorer = build_with_own_rng(lambda d, n: rule(d, n, layer_idx), d_head, n_heads)
        else:
            scorer = rule(d_head, n_heads, layer_idx)
        group = getattr(scorer, "head_group", 1)
        if n_heads % group or n_kv_heads % group:
            raise ValueError(
                f"scoring={self.scoring!r} pairs heads into sub-heads: n_heads={n_heads} and "
                f"n_kv_heads={n_kv_heads} must both be {'even' if group == 2 else f'multiples of {group}'}"
            )
        if not isinstance(scoring, str):
            self.scoring = getattr(scoring, "__name__", type(scorer).__name__)
        return scorer

    def _upgrade_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: object) -> None:
        """Rename the parameters of state dicts written in an earlier layout (:data:`LEGACY_STATE_KEYS`)."""
        for key in [k for k in state_dict if k.startswith(prefix)]:
            name = key[len(prefix) :]
            for old, new in LEGACY_STATE_KEYS:
                if name == old or (old.endswith(".") and name.startswith(old)):
                    state_dict[prefix + new + name[len(old) :]] = state_dict.pop(key)
                    break

    @declared_flags
    def named_modules(
        self, memo: set[nn.Module] | None = None, prefix: str = "", remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Module]]:
        """``nn.Module.named_modules``; with a scoring rule whose ``inline_parameter_order`` is set (Differential
        Attention), the rule right after the layer and its submodules after the layer's others, so that
        ``parameters()`` lists its own parameters first and its submodules' last, as when they were the layer's
        (state-dict keys stay ``scorer.*``; see the class docstring)."""
        rule = self._modules.get("scorer")
        if rule is None or not getattr(rule, "inline_parameter_order", False):
            yield from super().named_modules(memo, prefix, remove_duplicate)
            return
        memo = set() if memo is None else memo
        if self in memo:
            return
        dot = prefix + "." if prefix else ""
        if remove_duplicate:
            memo.update((self, rule))
        yield prefix, self
        yield dot + "scorer", rule
        children = [(n, m) for n, m in self._modules.items() if n != "scorer"]
        for name, module in children + [(f"scorer.{n}", m) for n, m in rule._modules.items()]:
            if module is not None:
                yield from module.named_modules(memo, dot + name, remove_duplicate)

    @property
    def keys_per_query_head(self) -> bool:
        """Whether keys are repeated to one per query head before the map (and cached that way)."""
        return self.qk_map is not None and getattr(self.qk_map, "keys_per_query_head", True)

    def decoding_fold(self, cache: LayerCache) -> FoldedProjection | None:
        """The map folded into the projection for a single-token step with ``cache``, or ``None`` when folding
        is off (``fold_inference = False``), impossible for this map or cache.

        The fold lives on the cache (``cache.folds``: layer index -> fold, ``None`` for a layer that cannot fold)
        and is validated once per cache, at its first single-token step: the weights' versions and checksum are
        compared with the layer's last fold, which is reused when equal (see :mod:`coupled_qk.layers.folded` for
        what each check catches). Later steps with the same cache only look it up. Never inside a compiled
        graph: there Inductor fuses the map's elementwise work and the unfolded map is faster than the fold,
        which adds arithmetic (``benchmarks/results/fastpath/compiled-decode-fold-ab.md``)."""
        if not self.fold_inference or torch.compiler.is_compiling():
            return None
        folds = getattr(cache, "folds", None)
        if folds is None:
            return None
        if self.layer_idx in folds:  # every step after the cache's first: a lookup
            return folds[self.layer_idx]
        key = None if self._modules.get("qk_map") is None else fold_key(self)
        fp = None
        if key is not None:
            fp = self._fold
            if fp is None or fp.key != key or fp.checksum != weight_checksum(self):
                fp = self._fold = fold_projection(self)
        folds[self.layer_idx] = fp
        return fp

    @staticmethod
    def _mapped(qk_map: nn.Module, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``qk_map(q, k)`` (the layer's map), checked: a registered map must return tensors of its inputs' shapes.

        Raises:
            ValueError: a map (a plugin's, say) returned other shapes, naming the map and both shapes.
        """
        q2, k2 = qk_map(q, k)
        if q2.shape != q.shape or k2.shape != k.shape:
            raise ValueError(
                f"the query-key map {type(qk_map).__name__} must return q and k of its inputs' "
                f"shapes {tuple(q.shape)} and {tuple(k.shape)}; it returned {tuple(q2.shape)} and "
                f"{tuple(k2.shape)}"
            )
        return q2, k2

    def __getstate__(self) -> dict[str, Any]:
        """Pickling and ``copy.deepcopy`` leave the decoding fold behind (it is rebuilt when needed)."""
        return {**super().__getstate__(), "_fold": None}

    def _per_query_head(self, k: torch.Tensor) -> torch.Tensor:
        return k if k.shape[1] == self.n_heads else expand_kv(k, self.n_rep, self.head_group)

    def forward(
        self,
        x: torch.Tensor,
        rope: Sequence[torch.Tensor] | None = None,
        cache: LayerCache | None = None,
        record: bool = False,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, AttentionRecord]:
        """Causal self-attention of ``x`` (the class docstring has the details).

        Args:
            x: ``(B, T, d_model)``, floating point, the parameters' dtype (any under ``torch.autocast``) and device.
            rope: ``(cos, sin)`` or ``(cos, sin, signed sin)`` of shape ``(T, d_head)`` or ``(B or 1, 1, T, d_head)``
                for the current positions when the layer uses RoPE, else ``None``.
            cache: a :class:`~coupled_qk.layers.kv_cache.LayerCache` to read and extend at ``layer_idx`` (its keys are
                the mapped, rotated ones), or ``None``.
            record: run the eager path and also return an :class:`AttentionRecord`.
            key_mask: bool ``(B, T_past + T)``, False at padded keys, or ``None``.

        Returns:
            ``y`` of shape ``(B, T, d_model)`` and ``x``'s dtype (under autocast, the autocast dtype), or
            ``(y, AttentionRecord)`` with ``record``.

        Raises:
            TypeError, ValueError: (``check_every_call``) ``x``, ``rope`` or ``key_mask`` of the wrong kind, shape,
                dtype or device, naming it (:func:`~coupled_qk.layers.layer_inputs.check_layer_inputs`). ValueError:
                a ``key_mask`` that is not bool or not ``T_past + T`` long
                (:func:`~coupled_qk.layers.scoring.attention_mask_4d`); a map that changed the shapes of ``q``,
                ``k``; a scoring rule that returned no probabilities when ``record``.
        """
        if self.check_every_call and not torch.compiler.is_compiling():
            check_layer_inputs(self, x, rope, key_mask)
        b, t, _ = x.shape
        h, hkv, dh = self.n_heads, self.n_kv_heads, self.d_head
        qk_map = self._modules.get("qk_map")  # read once: a submodule read goes through Module.__getattr__ (slow)
        has_map = qk_map is not None
        tables: Sequence[torch.Tensor] = () if rope is None else rope  # read with use_rope only
        folded = None
        if t == 1 and has_map and cache is not None and not record and not torch.is_grad_enabled():
            folded = self.decoding_fold(cache)
        # no map, or a folded one: q and k rotate together (one rotation, not two)
        rotated = self.use_rope and (folded is not None or not has_map)
        if folded is not None:  # a decoding step: the map is folded into the projection (layers/folded.py)
            qk, v = folded_qkv(folded, x)  # a fold acts before RoPE (fold_key): rotate the mapped q' | k'
            qk = qk.view(b, t, qk.shape[-1] // dh, dh).transpose(1, 2)
            if rotated:
                qk = apply_rope(qk, *tables)
            q, k = qk[:, :h], qk[:, h:]
        elif rotated:
            z = self.qkv(x)
            qk = apply_rope(z[..., : (h + hkv) * dh].view(b, t, h + hkv, dh).transpose(1, 2), *tables)
            q, k, v = qk[:, :h], qk[:, h:], z[..., (h + hkv) * dh :]
        else:
            q, k, v = self.qkv(x).split([h * dh, hkv * dh, hkv * dh], dim=-1)
        if not rotated and folded is None:
            q = q.view(b, t, h, dh).transpose(1, 2)
            k = k.view(b, t, k.shape[-1] // dh, dh).transpose(1, 2)  # not -1: B or T may be 0
        group = self.head_group
        v = v.view(b, t, hkv // group, group * dh).transpose(1, 2)
        if folded is None and self.keys_per_query_head:  # each query head evolves its own copy of the key
            k = expand_kv(k, self.n_rep, group)
        if self.use_rope and self.map_position == "post_rope" and not rotated:
            q, k = apply_rope(q, *tables), apply_rope(k, *tables)
        maps: dict[str, torch.Tensor] = {}
        if folded is None and qk_map is not None:
            q_in, k_in = q, k
            q, k = self._mapped(qk_map, q, k)
            if record:
                maps = dict(
                    q=q_in.detach(),
                    k=self._per_query_head(k_in).detach(),
                    q_mapped=q.detach(),
                    k_mapped=self._per_query_head(k).detach(),
                )
        if self.use_rope and self.map_position == "pre_rope" and not rotated:
            q, k = apply_rope(q, *tables), apply_rope(k, *tables)
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)
        # grouped-query heads are read in place (no repeated copy of the cache; see scaled_dot_product)
        eager = record or self.impl == "eager"
        p = self.dropout if self.training else 0.0
        mask = attention_mask_4d(key_mask, t, k.shape[-2])
        if mask is None and cache is not None and hasattr(cache, "attn_mask"):
            mask = cache.attn_mask()  # a StaticKVCache: hide its unwritten slots
        if self.scorer is None:
            y, probs = scaled_dot_product(q, k, v, eager, p, mask)
        else:
            y, probs = self.scorer(q, k, v, eager, p, mask)
        y = self.out_proj(y.transpose(1, 2).reshape(b, t, h * dh))
        if not record:
            return y
        return y, self._record(maps, probs)

    def _record(
        self, maps: dict[str, torch.Tensor], probs: torch.Tensor | dict[str, torch.Tensor | None] | None
    ) -> AttentionRecord:
        """The :class:`AttentionRecord` of a recorded call from the map's tensors and what the scoring rule
        returned when eager: the probabilities, or a dict of record fields (:class:`ScoringRule`).

        Raises:
            ValueError: a scoring rule returned no probabilities with ``eager=True`` (its contract).
        """
        fields = dict(probs) if isinstance(probs, dict) else {"attn": probs}  # a copy: the rule's dict stays whole
        attn = fields.pop("attn", None)
        if attn is None:  # the diagnostics read the probabilities
            raise ValueError(
                f"scoring rule {type(self.scorer).__name__} returned probabilities None with eager=True; "
                f"it must return (y, probabilities (B, H, T_q, T_k)) when eager"
            )
        dt = getattr(self.qk_map, "dt", None)
        return AttentionRecord(
            q=maps.get("q"),
            k=maps.get("k"),
            q_mapped=maps.get("q_mapped"),
            k_mapped=maps.get("k_mapped"),
            attn=attn,
            **fields,
            dt=None if dt is None else dt.detach(),
        )

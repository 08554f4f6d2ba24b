"""Causal self-attention: one optional query-key map and one scoring rule (docs/METHOD.md sections 1-2).

The layer knows nothing about variant names; :mod:`coupled_qk.models.variants` builds it from a registered
(query-key map x scoring) pair. Scoring rules (:data:`SCORINGS`, code in :mod:`coupled_qk.layers.scoring`):

- ``standard``: scaled dot-product attention (Vaswani et al. 2017).
- ``differential``: Differential Attention V1 (Ye et al. 2024, arXiv:2410.05258, microsoft/unilm
  Diff-Transformer): ``(A1 - lambda A2) V`` with half the heads, per-head RMSNorm and ``(1 - lambda_init)``.

Other scoring rules are modules following :class:`ScoringRule` (registered with
:func:`coupled_qk.models.registry.register_scoring`, from inside or outside the package); the layer takes
their class (or factory) as ``scoring``.

The query-key map (:mod:`coupled_qk.layers.qk_maps`, e.g. the coupled dynamics or the uncoupled query MLP)
transforms the projected ``(q, k)`` before scoring, before RoPE (``map_position="pre_rope"``, default) or
after it (``"post_rope"``); with differential scoring it acts on each query/key sub-head before both maps.

The fast path is ``torch.nn.functional.scaled_dot_product_attention``; the eager path (``impl="eager"``, or
``forward(..., record=True)``) computes the softmax explicitly in float32 and can return an
:class:`AttentionRecord` for diagnostics. Grouped-query attention: ``n_kv_heads`` divides ``n_heads``;
query head ``i`` uses key/value head ``i // (n_heads // n_kv_heads)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

from coupled_qk._checks import boolean, finite, nonneg_int, positive_int
from coupled_qk.layers.folded import FoldedProjection, fold_key, fold_projection, folded_qkv, weight_checksum
from coupled_qk.layers.kv_cache import KVCache
from coupled_qk.layers.layer_inputs import check_layer_inputs
from coupled_qk.layers.scoring import (  # noqa: F401 - the scoring names are public here too
    SCORINGS,
    ScoringFactory,
    ScoringRule,
    attention_mask_4d,
    differential_lambda_init,
    differential_split_values,
    scaled_dot_product,
)
from coupled_qk.ops.heads import expand_kv
from coupled_qk.ops.rope import apply_rope

MAP_POSITIONS = ("pre_rope", "post_rope")
"""Where the query-key map acts relative to RoPE."""


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
            scoring, where ``H_map = H / 2``.
        attn2: ``A2`` (differential scoring) or ``None``.
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


QKMapFactory = Callable[[int, int], nn.Module]
"""``(d_head, n_heads) -> query-key map module`` (see :mod:`coupled_qk.layers.qk_maps`)."""

_LEGACY_PREFIXES = (("dynamics.", "qk_map."), ("query_mlp.", "qk_map.mlp."), ("dt", "qk_map.dt"))


MAP_RNG_SALT = 0x5EED_C0DE
"""Mixed into the seed of a query-key map's own random stream (:func:`build_with_own_rng`)."""


def build_with_own_rng(factory, d_head: int, n_heads: int) -> nn.Module:
    """Build a query-key map from ``factory(d_head, n_heads)`` with its own random stream.

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
        n_heads: query heads of the standard layout. Differential scoring uses ``n_heads // 2`` heads, each
            with two query/key sub-heads of width ``d_head`` and a value of width ``2 d_head``
            (parameter-matched, as in arXiv:2410.05258).
        n_kv_heads: key/value heads (grouped-query attention); divides ``n_heads``.
        d_head: head width.
        qk_map: ``None`` (no map), a factory ``(d_head, n_heads) -> module`` following the interface of
            :mod:`coupled_qk.layers.qk_maps` (a map class itself is one; it is called after the projections
            are created, so parameters are created and randomly initialised in a fixed order), or a map
            module built by the caller.
        scoring: ``"standard"``, ``"differential"`` or another rule's :class:`ScoringRule` class (or factory
            ``(d_head, n_heads, layer_idx) -> module``), built into ``self.scorer``.
        layer_idx: 0-based layer index (sets the differential ``lambda_init`` and the cache slot).
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

    Differential scoring on the fast path: ``layer.split_values`` (default ``None``: on CUDA only) computes
    ``A1 V`` and ``A2 V`` with the value split into halves of width ``d_head`` in one SDPA call
    (:func:`differential_split_values`), so every head width is equal and CUDA's flash kernel is eligible; the
    function is the same up to rounding. The per-head RMSNorm runs in its weight's dtype (float32 under
    autocast) and returns the input dtype.

    State dicts saved before the map became one submodule (``dynamics.*``, ``query_mlp.*``, ``dt``) load.

    Raises:
        ValueError: unknown scoring, impl or map position, head counts that do not divide, differential
            scoring with an odd head count, ``use_rope`` with an odd ``d_head``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int,
        d_head: int,
        qk_map: QKMapFactory | None = None,
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
        boolean("use_rope", use_rope)
        finite("dropout", dropout, 0, 1, hi_open=True)
        if isinstance(scoring, str) and scoring not in SCORINGS:
            raise ValueError(f"scoring={scoring!r} is unknown; expected one of {SCORINGS} or a ScoringRule class")
        if not isinstance(scoring, str) and not callable(scoring):
            raise ValueError(f"scoring={scoring!r} must be a name in {SCORINGS} or a ScoringRule class (factory)")
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
        self.differential = scoring == "differential"
        if self.differential and (n_heads % 2 or n_kv_heads % 2):
            raise ValueError(
                f"scoring='differential' pairs heads into sub-heads: n_heads={n_heads} and "
                f"n_kv_heads={n_kv_heads} must both be even"
            )
        self.scoring, self.layer_idx, self.impl = scoring, layer_idx, impl
        self.n_heads, self.n_kv_heads, self.d_head = n_heads, n_kv_heads, d_head
        self.n_rep = n_heads // n_kv_heads
        self.map_position, self.use_rope, self.dropout = map_position, use_rope, dropout
        self.qkv = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * d_head, bias=False)
        self.out_proj = nn.Linear(n_heads * d_head, d_model, bias=False)
        if qk_map is not None and not isinstance(qk_map, nn.Module):
            qk_map = build_with_own_rng(qk_map, d_head, n_heads)
        self.qk_map = qk_map
        self.scorer = None  # an added scoring rule (ScoringRule); None for the built-in ones
        if not isinstance(scoring, str):
            self.scorer = build_with_own_rng(lambda d, n: scoring(d, n, layer_idx), d_head, n_heads)
            if getattr(self.scorer, "head_group", 1) != 1:
                raise ValueError(
                    f"scoring rule {type(self.scorer).__name__} has head_group="
                    f"{self.scorer.head_group}; added scoring rules must use head_group=1"
                )
            self.scoring = getattr(scoring, "__name__", type(self.scorer).__name__)
        if qk_map is not None:
            map_heads = getattr(qk_map, "n_heads", n_heads)
            if map_heads != n_heads or getattr(qk_map, "d_head", d_head) != d_head:
                raise ValueError(
                    f"qk_map acts on {map_heads} heads of width {getattr(qk_map, 'd_head', d_head)}; this layer "
                    f"has n_heads={n_heads} of width d_head={d_head}"
                )
            # shapes are guaranteed from here on: no per-call (per-token) input checks in the map
            qk_map.check_every_call = False
            if self.differential and hasattr(qk_map, "head_group"):
                qk_map.head_group = 2
        if self.differential:
            self.lambda_init = differential_lambda_init(layer_idx)
            self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
                nn.Parameter(torch.randn(d_head) * 0.1) for _ in range(4)
            )
            self.subln = nn.RMSNorm(2 * d_head, eps=1e-5, elementwise_affine=True)
        # differential scoring: one SDPA call with values split into halves of width d_head (None: on CUDA)
        self.split_values: bool | None = None
        self.fold_inference = True  # decoding folds the map into the projection (layers/folded.py)
        self.check_every_call = True  # check x, rope, key_mask per call (layers/layer_inputs.py; GPT turns it off)
        self._fold: FoldedProjection | None = None
        self._register_load_state_dict_pre_hook(self._upgrade_state_dict)

    def reset_parameters(self) -> None:
        """Re-draw the layer's own parameters (differential scoring's lambdas, ``N(0, 0.1)`` as at construction);
        the submodules (projections, map, norm) have their own ``reset_parameters``."""
        if self.differential:
            for p in (self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2):
                nn.init.normal_(p, 0.0, 0.1)

    def _upgrade_state_dict(self, state_dict, prefix, *args) -> None:
        """Rename the parameters of state dicts written before the map became ``self.qk_map``."""
        for key in [k for k in state_dict if k.startswith(prefix)]:
            name = key[len(prefix) :]
            for old, new in _LEGACY_PREFIXES:
                if name == old or (old.endswith(".") and name.startswith(old)):
                    state_dict[prefix + new + name[len(old) :]] = state_dict.pop(key)
                    break

    @property
    def keys_per_query_head(self) -> bool:
        """Whether keys are repeated to one per query head before the map (and cached that way)."""
        return self.qk_map is not None and getattr(self.qk_map, "keys_per_query_head", True)

    def decoding_fold(self, cache) -> FoldedProjection | None:
        """The map folded into the projection for a single-token step with ``cache``, or ``None`` when folding
        is off (``fold_inference = False``), impossible for this map or cache.

        The fold lives on the cache (``cache.folds``: layer index -> fold, ``None`` for a layer that cannot fold)
        and is validated once per cache, at its first single-token step: the weights' versions and checksum are
        compared with the layer's last fold, which is reused when equal (see :mod:`coupled_qk.layers.folded` for
        what each check catches). Later steps with the same cache only look it up. Never inside a compiled
        graph: there Inductor fuses the map's elementwise work and the unfolded map is faster than the fold,
        which adds arithmetic (``benchmarks/results/issue29/compiled-decode-fold-ab.md``)."""
        if not self.fold_inference or self.qk_map is None:
            return None
        if torch.compiler.is_compiling():
            return None
        folds = getattr(cache, "folds", None)
        if folds is None:
            return None
        if self.layer_idx in folds:
            return folds[self.layer_idx]
        key = fold_key(self)
        fp = None
        if key is not None:
            fp = self._fold
            if fp is None or fp.key != key or fp.checksum != weight_checksum(self):
                fp = self._fold = fold_projection(self)
        folds[self.layer_idx] = fp
        return fp

    def _mapped(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``self.qk_map(q, k)``, checked: a registered map must return tensors of its inputs' shapes.

        Raises:
            ValueError: a map (a plugin's, say) returned other shapes, naming the map and both shapes.
        """
        q2, k2 = self.qk_map(q, k)
        if q2.shape != q.shape or k2.shape != k.shape:
            raise ValueError(
                f"the query-key map {type(self.qk_map).__name__} must return q and k of its inputs' "
                f"shapes {tuple(q.shape)} and {tuple(k.shape)}; it returned {tuple(q2.shape)} and "
                f"{tuple(k2.shape)}"
            )
        return q2, k2

    def __getstate__(self):
        """Pickling and ``copy.deepcopy`` leave the decoding fold behind (it is rebuilt when needed)."""
        return {**super().__getstate__(), "_fold": None}

    def _split_values(self, q: torch.Tensor) -> bool:
        """Whether differential scoring uses :func:`differential_split_values` (``split_values``: ``None`` =
        on CUDA only, where equal head widths let SDPA pick the flash kernel; ``True``/``False`` force it)."""
        return q.device.type == "cuda" if self.split_values is None else bool(self.split_values)

    def differential_lambda(self) -> torch.Tensor:
        """Scalar ``lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init`` (arXiv:2410.05258, eq. 2)."""
        dtype = torch.promote_types(self.lambda_q1.dtype, torch.float32)
        l1 = torch.exp(torch.dot(self.lambda_q1.to(dtype), self.lambda_k1.to(dtype)))
        l2 = torch.exp(torch.dot(self.lambda_q2.to(dtype), self.lambda_k2.to(dtype)))
        return l1 - l2 + self.lambda_init

    def _per_query_head(self, k: torch.Tensor) -> torch.Tensor:
        return k if k.shape[1] == self.n_heads else expand_kv(k, self.n_rep, 2 if self.differential else 1)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: KVCache | None = None,
        record: bool = False,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, AttentionRecord]:
        if self.check_every_call and not torch.compiler.is_compiling():
            check_layer_inputs(self, x, rope, key_mask)
        b, t, _ = x.shape
        h, hkv, dh = self.n_heads, self.n_kv_heads, self.d_head
        folded = None
        if t == 1 and self.qk_map is not None and cache is not None and not record and not torch.is_grad_enabled():
            folded = self.decoding_fold(cache)
        # no map, or a folded one: q and k rotate together (one rotation, not two)
        rotated = self.use_rope and (folded is not None or self.qk_map is None)
        if folded is not None:  # a decoding step: the map is folded into the projection (layers/folded.py)
            qk, v = folded_qkv(folded, x)  # a fold acts before RoPE (fold_key): rotate the mapped q' | k'
            qk = qk.view(b, t, qk.shape[-1] // dh, dh).transpose(1, 2)
            if rotated:
                qk = apply_rope(qk, *rope)
            q, k = qk[:, :h], qk[:, h:]
        elif rotated:
            z = self.qkv(x)
            qk = apply_rope(z[..., : (h + hkv) * dh].view(b, t, h + hkv, dh).transpose(1, 2), *rope)
            q, k, v = qk[:, :h], qk[:, h:], z[..., (h + hkv) * dh :]
        else:
            q, k, v = self.qkv(x).split([h * dh, hkv * dh, hkv * dh], dim=-1)
        if not rotated and folded is None:
            q = q.view(b, t, h, dh).transpose(1, 2)
            k = k.view(b, t, k.shape[-1] // dh, dh).transpose(1, 2)  # not -1: B or T may be 0
        group = 2 if self.differential else 1
        v = v.view(b, t, hkv // group, group * dh).transpose(1, 2)
        if folded is None and self.keys_per_query_head:  # each query head evolves its own copy of the key
            k = expand_kv(k, self.n_rep, group)
        if self.use_rope and self.map_position == "post_rope" and not rotated:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        maps = {}
        if folded is None and self.qk_map is not None:
            q_in, k_in = q, k
            q, k = self._mapped(q, k)
            if record:
                maps = dict(
                    q=q_in.detach(),
                    k=self._per_query_head(k_in).detach(),
                    q_mapped=q.detach(),
                    k_mapped=self._per_query_head(k).detach(),
                )
        if self.use_rope and self.map_position == "pre_rope" and not rotated:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)
        # grouped-query heads are read in place (no repeated copy of the cache; see scaled_dot_product)
        eager = record or self.impl == "eager"
        p = self.dropout if self.training else 0.0
        lam = a2 = None
        mask = attention_mask_4d(key_mask, t, k.shape[-2])
        if mask is None and cache is not None and hasattr(cache, "attn_mask"):
            mask = cache.attn_mask()  # a StaticKVCache: hide its unwritten slots
        if self.scorer is not None:
            y, a1 = self.scorer(q, k, v, eager, p, mask)
        elif not self.differential:
            y, a1 = scaled_dot_product(q, k, v, eager, p, mask)
        elif not eager and self._split_values(q):
            y1, y2 = differential_split_values(q, k, v, p, mask)
            a1 = None
        else:
            y1, a1 = scaled_dot_product(q[:, 0::2], k[:, 0::2], v, eager, p, mask)
            y2, a2 = scaled_dot_product(q[:, 1::2], k[:, 1::2], v, eager, p, mask)
        if self.differential:
            lam = self.differential_lambda()
            z = y1 - lam.to(y1.dtype) * y2
            # the norm runs in its weight's precision (fp32 under autocast: no bf16-input/fp32-weight mismatch,
            # which also disables the fused kernel); fp32 and fp64 models see no cast at all
            norm_dtype = torch.promote_types(z.dtype, self.subln.weight.dtype)
            y = (self.subln(z.to(norm_dtype)) * (1.0 - self.lambda_init)).to(z.dtype)
        y = self.out_proj(y.transpose(1, 2).reshape(b, t, h * dh))
        if not record:
            return y
        if a1 is None:  # an added rule's contract (ScoringRule): the diagnostics read the probabilities
            raise ValueError(
                f"scoring rule {type(self.scorer).__name__} returned probabilities None with eager=True; "
                f"it must return (y, probabilities (B, H, T_q, T_k)) when eager"
            )
        dt = getattr(self.qk_map, "dt", None)
        rec = AttentionRecord(
            q=maps.get("q"),
            k=maps.get("k"),
            q_mapped=maps.get("q_mapped"),
            k_mapped=maps.get("k_mapped"),
            attn=a1,
            attn2=a2,
            lam=None if lam is None else lam.detach(),
            dt=None if dt is None else dt.detach(),
        )
        return y, rec

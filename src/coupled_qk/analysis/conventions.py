"""Names, order and conventions of the attention diagnostics, shared by capture and report (docs/METHOD.md
section 7). No torch-heavy code: the capture (:mod:`coupled_qk.analysis.capture`) and the report
(:mod:`coupled_qk.analysis.report`) both import this module, never each other."""

from __future__ import annotations

import math

__all__ = [
    "MAP_METRICS",
    "CONVENTIONS",
    "PER_LAYER_TABLES",
    "describe_metric",
    "order_metrics",
    "metric_rank",
    "reference_scale",
    "HEADLINE_METRICS",
]

#: Per-map scalar diagnostics (names as in :func:`coupled_qk.analysis.attention_stats.summarize_attention`).
MAP_METRICS = (
    "entropy",
    "normalized_entropy",
    "effective_rank",
    "spectral_gap_ratio",
    "spectral_gap_relative",
    "sink_mass",
)
_SPECTRAL = ("effective_rank", "spectral_gap_ratio", "spectral_gap_relative")

#: Written into every result so that the JSON files are self-describing.
CONVENTIONS = {
    "averaging": "each per-map value is computed per sequence and averaged over the sequences; layer values "
    "('mean') are means over heads; model values ('mean' at the top) are means over layers",
    "entropy": "nats, mean over all T rows of the row entropy (row 0 of a causal map has entropy 0 and is included)",
    "normalized_entropy": "row i (0-based) divided by log(i + 1), averaged over rows 1..T-1 (row 0 excluded); "
    "1 = uniform over the allowed keys",
    "effective_rank": "Roy & Vetterli 2007: exp(H(p)), p = sigma / sum(sigma); singular values <= "
    "T * eps_float64 * sigma1 count as 0",
    "spectral_gap": "spectral_gap_ratio = sigma1 / sigma2 (mean over sequences of the per-map ratio), "
    "spectral_gap_relative = (sigma1 - sigma2) / sigma1",
    "singular_values": "'spectrum': per head, the descending singular values of the map averaged over the "
    "sequences (float64 SVD; stored to 6 significant digits)",
    "sink_mass": "mean over rows 1..T-1 of the attention on key 0 (row 0 excluded; it is trivially 1)",
    "rank_collapse_residual": "Dong et al. 2021, block output X (T, d) per sequence: ||X - 1 mean(X)^T||_F / "
    "||X||_F; '_l1inf' uses Dong et al.'s composite l1/l_inf norm with the column median (an upper bound of "
    "their exact residual); 'rank_collapse_input' is the embedding output entering block 0",
    "dt": "learned step size per query head (per query sub-head for coupled_differential: sub-heads 2j, 2j+1 "
    "belong to differential head j); null for variants without dynamics",
    "q_update/k_update": "mean over tokens of |q' - q|_2 / |q|_2 (and for keys) per query (sub-)head, "
    "q = projection before the dynamics (RoPE-rotated for map_position='post_rope'), q' = after; "
    "coupled variants compare each query head's own copy of the key; uncoupled_mlp leaves keys untouched "
    "(k_update = 0); absent for standard/differential",
    "differential": "A1 and A2 are reported separately (a1/..., a2/...); the signed map A1 - lambda A2 is not "
    "a probability matrix, so only its spectrum, effective rank and spectral gap are reported (signed/...); "
    "heads are the n_heads // 2 differential heads; 'lambda' is the layer's lambda",
    "non_finite": "non-finite values (e.g. sigma1/sigma2 = inf when sigma2 = 0) are written as null in JSON",
}


def as_float(x) -> float:
    """``float`` of a Python number or a one-element tensor."""
    return float(x.item() if hasattr(x, "item") else x)


def mean_of(values) -> float:
    """Mean of an iterable of numbers (``nan`` when empty)."""
    vals = [float(v) for v in values]
    return float(sum(vals) / len(vals)) if vals else math.nan


def metric_rank(key: str) -> tuple:
    """Sort key of a metric key ``"[prefix/]base"`` (``"a1/entropy"``): ``(position of base, position of prefix,
    key)``, bases in the order of :data:`MAP_METRICS` then the rank-collapse residuals, ``dt``, the updates and
    ``lambda``; prefixes ``""``, ``a1``, ``a2``, ``signed``. An unknown base or prefix sorts after the known ones
    (alphabetically among themselves); never raises."""
    prefix, _, base = key.rpartition("/")
    order = list(MAP_METRICS) + [
        "rank_collapse_residual",
        "rank_collapse_residual_l1inf",
        "dt",
        "q_update",
        "k_update",
        "lambda",
    ]
    prefixes = ["", "a1", "a2", "signed"]
    return (
        order.index(base) if base in order else len(order),
        prefixes.index(prefix) if prefix in prefixes else len(prefixes),
        key,
    )


def order_metrics(d: dict) -> dict:
    """A copy of ``d`` (metric key -> value) with its keys in the report's order (:func:`metric_rank`)."""
    return {k: d[k] for k in sorted(d, key=metric_rank)}


DESCRIPTIONS = {
    "entropy": "attention entropy (nats)",
    "normalized_entropy": "normalised entropy (/ log row length)",
    "effective_rank": "effective rank (Roy & Vetterli)",
    "spectral_gap_ratio": "spectral gap sigma1/sigma2",
    "spectral_gap_relative": "relative gap (sigma1-sigma2)/sigma1",
    "sink_mass": "sink mass on position 0",
    "rank_collapse_residual": "rank-collapse residual (Frobenius)",
    "rank_collapse_residual_l1inf": "rank-collapse residual (l1/l_inf)",
    "dt": "learned dt",
    "q_update": "relative query update |q'-q|/|q|",
    "k_update": "relative key update |k'-k|/|k|",
    "lambda": "differential lambda",
}
MAP_NAMES = {"a1": "A1", "a2": "A2", "signed": "A1 - lambda A2"}

#: Metrics given a per-layer table in ``summary.md``.
PER_LAYER_TABLES = ("normalized_entropy", "effective_rank", "sink_mass", "rank_collapse_residual", "q_update")


def describe_metric(key: str) -> str:
    """Human-readable name of a metric key (``"a1/entropy"`` -> ``"attention entropy (nats) [A1]"``)."""
    prefix, _, base = key.rpartition("/")
    text = DESCRIPTIONS.get(base, base)
    return f"{text} [{MAP_NAMES.get(prefix, prefix)}]" if prefix else text


def reference_scale(key: str, seq_len: int) -> str | None:
    """The reference point of a diagnostic over windows of ``seq_len`` tokens, written next to its values (a
    number alone, "effective rank 55.1" or "normalised entropy 0.993", said nothing): ``"max 128 = window"``,
    ``"1 = uniform, 0 = one key"``, the value of uniform causal attention, ... ``None`` for a metric without one
    (``dt``, ``lambda``, the ``l1/l_inf`` residual).

    Uniform causal attention (row ``i`` spreads evenly over keys ``0..i``) has entropy ``log(T!) / T`` nats (the
    mean over rows ``0..T-1`` of ``log(i + 1)``) and sink mass ``(H_T - 1) / (T - 1)`` (the mean over rows
    ``1..T-1`` of ``1 / (i + 1)``, ``H_T`` the harmonic number), in the conventions of :data:`CONVENTIONS`.

    Raises:
        ValueError: ``seq_len`` below 2.
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
        raise ValueError(f"seq_len={seq_len!r} must be an integer >= 2 (tokens per analysed window)")
    base = key.rpartition("/")[2]
    t = seq_len
    if base == "entropy":
        return f"uniform: {math.lgamma(t + 1) / t:.3f} nats"
    if base == "sink_mass":
        harmonic = sum(1 / (i + 1) for i in range(t))
        return f"uniform: {(harmonic - 1) / (t - 1):.3f}, 1 = all on key 0"
    return {
        "normalized_entropy": "1 = uniform, 0 = one key",
        "effective_rank": f"max {t} = window",
        "spectral_gap_ratio": "1 = no gap",
        "spectral_gap_relative": "0 = no gap, 1 = rank one",
        "rank_collapse_residual": "0 = collapsed, max 1",
        "q_update": "0 = unchanged",
        "k_update": "0 = unchanged",
    }.get(base)


#: The layer-averaged metrics ``coupled-qk analyze`` prints per checkpoint, each with its reference.
HEADLINE_METRICS = ("normalized_entropy", "effective_rank", "sink_mass", "rank_collapse_residual")

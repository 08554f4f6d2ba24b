"""Attention diagnostics of GPT models and checkpoints on real text (PAPER.md section 7).

:func:`analyze_model` runs one no-grad forward pass of a :class:`~coupled_qk.models.gpt.GPT` over a batch of
token windows through the eager attention path (each attention layer's ``record`` flag) and computes, per
layer and per head, the diagnostics of :mod:`coupled_qk.analysis.metrics`:

* attention entropy (nats, mean over all rows) and normalised entropy (row ``i`` divided by
  ``log(i + 1)``, row 0 excluded), attention-sink mass on the first key (row 0 excluded), the effective rank
  (Roy & Vetterli 2007), the singular-value spectrum and the spectral gap ``sigma1/sigma2`` and
  ``(sigma1 - sigma2)/sigma1`` of every attention map;
* the rank-collapse residual (Dong et al. 2021) of every block's output ``(B, T, d_model)``, taken by a
  forward hook on the block (relative Frobenius distance from the nearest ``1 x^T``, and the l1/l_inf
  variant), plus the same for the embedding output that enters block 0;
* the learned step size ``dt`` per head (``attn.dynamics.dt`` for ``coupled`` / ``coupled_differential``,
  ``attn.dt`` for ``uncoupled_mlp``) and the relative update sizes ``|q' - q| / |q|`` and
  ``|k' - k| / |k|`` of the dynamics (mean over tokens; ``uncoupled_mlp`` leaves keys untouched, so its
  key update is exactly 0);
* for Differential Attention (``differential``, ``coupled_differential``): both softmax maps ``A1`` and
  ``A2`` (keys ``a1/...`` and ``a2/...``) and, for the signed map ``A1 - lambda A2``, only the spectrum,
  effective rank and spectral gap (keys ``signed/...``): the signed map is not a probability matrix, so
  entropies and sink mass are undefined for it (the convention of
  :func:`coupled_qk.analysis.metrics.summarize_differential_attention`).

Every per-map value is computed for each sequence and then averaged over the sequences (so a value is the
mean over the batch of the per-map diagnostic, e.g. the mean of the per-map ratios ``sigma1/sigma2``);
per-layer values are means over heads, model values are means over layers.

:func:`analyze_checkpoints` does this for several checkpoints on the same windows of a corpus split and
writes ``analysis.json``, PNG figures (:mod:`coupled_qk.analysis.plots`) and ``summary.md``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from coupled_qk.analysis import metrics
from coupled_qk.layers.attention import COUPLED_VARIANTS, DIFFERENTIAL_VARIANTS
from coupled_qk.ops.rope import apply_rope

__all__ = [
    "MAP_METRICS",
    "CONVENTIONS",
    "analyze_model",
    "token_windows",
    "analyze_checkpoints",
    "summary_markdown",
]

#: Per-map scalar diagnostics (names as in :func:`coupled_qk.analysis.metrics.summarize_attention`).
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
    "entropy": "nats, mean over all T rows of the row entropy (row 0 of a causal map has entropy 0 and is "
    "included)",
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
    "q = projection before the dynamics (RoPE-rotated for dynamics_position='post_rope'), q' = after; "
    "coupled variants compare each query head's own copy of the key; uncoupled_mlp leaves keys untouched "
    "(k_update = 0); absent for standard/differential",
    "differential": "A1 and A2 are reported separately (a1/..., a2/...); the signed map A1 - lambda A2 is not "
    "a probability matrix, so only its spectrum, effective rank and spectral gap are reported (signed/...); "
    "heads are the n_heads // 2 differential heads; 'lambda' is the layer's lambda",
    "non_finite": "non-finite values (e.g. sigma1/sigma2 = inf when sigma2 = 0) are written as null in JSON",
}


class _StopForward(Exception):
    """Raised by the last block's hook to skip the final LayerNorm and the (large) output head."""


def _float(x) -> float:
    return float(x.item() if isinstance(x, torch.Tensor) else x)


def _mean(values) -> float:
    vals = [float(v) for v in values]
    return float(sum(vals) / len(vals)) if vals else float("nan")


class _LayerAccumulator:
    """Running sums over sequences for one layer (all tensors float64 on CPU)."""

    def __init__(self) -> None:
        self.n = 0
        self.heads: dict[str, torch.Tensor] = {}  # metric -> (H,)
        self.spectra: dict[str, torch.Tensor] = {}  # map -> (H, T)
        self.qk: dict[str, torch.Tensor] = {}  # metric -> (H_q,)
        self.scalars: dict[str, torch.Tensor] = {}  # metric -> ()
        self.lam: float | None = None

    @staticmethod
    def _add(store: dict[str, torch.Tensor], key: str, value: torch.Tensor) -> None:
        value = value.detach().to("cpu", torch.float64)
        store[key] = store[key] + value if key in store else value


def _attention_layers(model) -> list:
    blocks = getattr(model, "blocks", None)
    if blocks is None or not len(blocks) or not all(hasattr(b, "attn") for b in blocks):
        raise TypeError(
            f"model must be a coupled_qk GPT (with .blocks[i].attn); got {type(model).__name__}"
        )
    return [b.attn for b in blocks]


def _dt_of(attn) -> torch.Tensor | None:
    """The learned per-head step size of a layer, or None for variants without one."""
    if attn.attention in COUPLED_VARIANTS:
        return attn.dynamics.dt.detach()
    if attn.attention == "uncoupled_mlp":
        return attn.dt.detach()
    return None


@contextmanager
def _single_threaded(enabled: bool):
    """Run torch single-threaded inside the block (restoring the previous count), if ``enabled``.

    LAPACK's multithreaded SVD of a few-hundred-square matrix synchronises its threads hundreds of times
    per matrix; on a busy machine each synchronisation can wait for a time slice, which we measured to make
    ``svdvals`` of 512 x 512 attention maps 20-50x slower with 2 threads than with 1. Parallelism comes from
    running heads concurrently in worker threads instead.
    """
    if not enabled:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _accumulate_maps(acc: _LayerAccumulator, rec: dict, differential: bool, pool: ThreadPoolExecutor | None
                     ) -> None:
    """Per-head map diagnostics of one recorded layer, summed over the batch into ``acc``."""
    if "attn" not in rec:
        raise RuntimeError("the attention layer recorded no probabilities (is the record flag honoured?)")
    A1 = rec["attn"]
    n_heads = A1.shape[1]

    def one_head(h: int) -> dict[str, torch.Tensor]:  # one head bounds the float64 working set to (B, T, T)
        if differential:
            return metrics.summarize_differential_attention(A1[:, h], rec["attn2"][:, h], rec["lambda_"])
        return metrics.summarize_attention(A1[:, h])

    summaries = list(pool.map(one_head, range(n_heads))) if pool is not None else map(one_head, range(n_heads))
    per_head: dict[str, list[torch.Tensor]] = {}
    for summary in summaries:
        for key, value in summary.items():
            per_head.setdefault(key, []).append(value.sum(dim=0))  # sum over the batch
    for key, values in per_head.items():
        stacked = torch.stack(values)  # (H,) or (H, T)
        if key.endswith("singular_values"):
            name = key.split("/")[0] if "/" in key else "attn"
            acc._add(acc.spectra, name, stacked)
        else:
            acc._add(acc.heads, key, stacked)
    if differential:
        acc.lam = _float(rec["lambda_"])


def _accumulate_qk(acc: _LayerAccumulator, rec: dict, attn, rope: tuple | None) -> None:
    """Relative update sizes of the dynamics, summed over the batch into ``acc``."""
    if attn.attention not in COUPLED_VARIANTS and attn.attention != "uncoupled_mlp":
        return
    q, k = rec["q"], rec["k"]
    if attn.use_rope and attn.dynamics_position == "post_rope":  # the dynamics act on rotated states
        if rope is None:
            raise RuntimeError("dynamics_position='post_rope' but the block received no RoPE tables")
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    acc._add(acc.qk, "q_update", metrics.relative_update(rec["q_evolved"], q).sum(dim=0))
    k_update = metrics.relative_update(rec["k_evolved"], k).sum(dim=0)  # (H_k,)
    if k_update.shape[0] != q.shape[1]:  # uncoupled_mlp keeps the n_kv_heads keys: one value per query head
        k_update = k_update.repeat_interleave(q.shape[1] // k_update.shape[0])
    acc._add(acc.qk, "k_update", k_update)


def _resolve_example(example, n_layer: int, n_map_heads: int) -> tuple[int, int] | None:
    if example is None:
        return None
    try:
        layer, head = (int(v) for v in example)
    except (TypeError, ValueError):
        raise ValueError(f"example must be a (layer, head) pair of ints or None; got {example!r}") from None
    if not -n_layer <= layer < n_layer:
        raise ValueError(f"example layer {layer} is out of range for a model with {n_layer} layers")
    if not -n_map_heads <= head < n_map_heads:
        raise ValueError(f"example head {head} is out of range: the attention maps have {n_map_heads} heads")
    return layer % n_layer, head % n_map_heads


def _check_tokens(tokens, config) -> torch.Tensor:
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"tokens must be a torch.Tensor of shape (B, T); got {type(tokens).__name__}")
    if tokens.dim() != 2 or tokens.dtype not in (torch.long, torch.int32, torch.int64):
        raise ValueError(f"tokens must be an integer tensor of shape (B, T); got {tokens.dtype} {tuple(tokens.shape)}")
    b, t = tokens.shape
    if b < 1:
        raise ValueError(f"tokens must hold at least one sequence; got shape {tuple(tokens.shape)}")
    if t < 2:
        raise ValueError(f"tokens must hold sequences of T >= 2 tokens (normalised entropy and sink mass exclude "
                         f"row 0); got shape {tuple(tokens.shape)}")
    if t > config.block_size:
        raise ValueError(f"sequence length T={t} exceeds the model's block_size={config.block_size}")
    return tokens.long()


@torch.no_grad()
def analyze_model(
    model,
    tokens: torch.Tensor,
    *,
    batch_size: int | None = None,
    example: tuple[int, int] | None = None,
    example_tokens: int = 128,
    threads: int | None = None,
) -> dict:
    """Per-layer, per-head attention diagnostics of ``model`` on ``tokens`` (PAPER.md section 7).

    The forward pass goes through the eager attention path: every attention layer's ``record`` flag is set
    and a forward hook on every block turns the recorded tensors (``q, k, q_evolved, k_evolved, attn``
    and, for differential variants, ``attn2, lambda_``) and the block output into metrics as soon as the
    block has run, then drops them (memory stays at one layer's maps). The last block's hook ends the pass
    early (the final LayerNorm and output head are not computed). Afterwards every ``record`` flag, every
    ``recorded`` dict and every module's ``training`` flag is restored and all hooks are removed, also when
    an error occurs; the model's parameters are never modified, so its outputs are unchanged. Dropout is
    off during the analysis (``model.eval()``).

    Args:
        model: a :class:`coupled_qk.models.gpt.GPT` (any attention variant, any device).
        tokens: LongTensor ``(B, T)`` of token ids, ``2 <= T <= block_size`` (moved to the model's device).
        batch_size: sequences per forward pass (default: all ``B`` at once); results do not depend on it
            beyond float rounding. Lower it to bound memory (the eager path holds ``(b, H, T, T)`` maps).
        example: ``(layer, head)`` of an attention map to return for plotting (negative indices allowed;
            ``head`` indexes the map heads, i.e. differential heads for differential variants), or None.
        example_tokens: the example map is the top-left ``min(T, example_tokens)`` square of sequence 0.
        threads: on CPU, heads whose metrics are computed concurrently (default ``torch.get_num_threads()``).
            While a layer's metrics run, torch is set to one thread (restored right after): LAPACK's
            multithreaded SVD is many times slower on a busy machine than one SVD per core. Ignored on GPUs.

    Returns:
        A dict (JSON-ready except ``"example"``) with

        * ``"attention"``, ``"n_layer"``, ``"n_map_heads"`` (heads per map: ``n_heads``, or ``n_heads // 2``
          for differential variants), ``"n_sequences"`` (B), ``"seq_len"`` (T), ``"conventions"``;
        * ``"layers"``: one dict per layer with ``"layer"`` (index), ``"heads"`` (metric -> list of
          ``n_map_heads`` floats: :data:`MAP_METRICS`, prefixed ``a1/``, ``a2/`` and ``signed/`` (spectral
          ones only) for differential variants), ``"spectrum"`` (map name ``attn`` or ``a1``/``a2``/``signed``
          -> per head the mean descending singular values, ``n_map_heads`` lists of T floats, rounded to 6
          significant digits),
          ``"qk_heads"`` (``dt``, ``q_update``, ``k_update`` -> lists over the ``n_heads`` query (sub-)heads,
          where the variant has them), ``"rank_collapse_residual"`` and ``"rank_collapse_residual_l1inf"``
          (floats), ``"lambda"`` (differential variants) and ``"mean"`` (every per-head metric averaged
          over heads, plus the layer's scalars);
        * ``"rank_collapse_input"``: ``{"fro", "l1inf"}`` residuals of the embedding output (block 0 input);
        * ``"mean"``: each key of the layers' ``"mean"`` averaged over layers;
        * ``"example"`` (only with ``example``): ``{"layer", "head", "sequence": 0, "tokens": n, "maps":
          {name: float32 numpy (n, n)}}`` with ``attn``, or ``a1``, ``a2`` and ``signed`` (``A1 - lambda A2``).

        All floats are ``float`` (nats for entropies, dimensionless otherwise); values may be ``inf``/``nan``
        where the metric convention says so (see :data:`CONVENTIONS`).

    Raises:
        TypeError: ``model`` is not a coupled_qk GPT, or ``tokens`` is not a tensor.
        ValueError: ``tokens`` is not an integer ``(B, T)`` tensor with ``B >= 1`` and ``2 <= T <=
            block_size``, ids outside the vocabulary, a bad ``batch_size`` / ``example`` /
            ``example_tokens``; attention maps that are not causal probability maps (metrics checks).
    """
    attns = _attention_layers(model)
    config = model.config
    tokens = _check_tokens(tokens, config)
    B, T = tokens.shape
    if batch_size is None:
        batch_size = B
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int or None; got {batch_size!r}")
    if isinstance(example_tokens, bool) or not isinstance(example_tokens, int) or example_tokens < 1:
        raise ValueError(f"example_tokens must be a positive int; got {example_tokens!r}")
    if threads is None:
        threads = torch.get_num_threads()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int or None; got {threads!r}")
    variant = config.attention
    differential = variant in DIFFERENTIAL_VARIANTS
    n_layer = len(attns)
    n_map_heads = config.n_heads // 2 if differential else config.n_heads
    example = _resolve_example(example, n_layer, n_map_heads)
    device = next(model.parameters()).device
    tokens = tokens.to(device)
    on_cpu = device.type == "cpu"

    accs = [_LayerAccumulator() for _ in range(n_layer)]
    input_rank = {"fro": torch.zeros((), dtype=torch.float64), "l1inf": torch.zeros((), dtype=torch.float64)}
    example_maps: dict[str, np.ndarray] = {}
    n_ex = min(T, example_tokens)
    first_chunk = [True]

    ropes: dict[int, tuple | None] = {}

    def make_pre_hook(i: int):
        def pre_hook(module, args, kwargs):
            # Block.forward(x, rope=None, cache=None): keep the RoPE tables the model passes to this block
            ropes[i] = kwargs["rope"] if "rope" in kwargs else (args[1] if len(args) > 1 else None)
            if i == 0:
                x = args[0] if args else kwargs["x"]
                input_rank["fro"] += metrics.rank_collapse_residual(x).sum().cpu()
                input_rank["l1inf"] += metrics.rank_collapse_residual(x, norm="l1inf").sum().cpu()

        return pre_hook

    def make_hook(i: int):
        def hook(module, args, output):
            attn = module.attn
            rec, attn.recorded = attn.recorded, {}
            acc = accs[i]
            with _single_threaded(on_cpu):
                _accumulate_maps(acc, rec, differential, pool)
            _accumulate_qk(acc, rec, attn, ropes.get(i))
            acc._add(acc.scalars, "rank_collapse_residual", metrics.rank_collapse_residual(output).sum())
            acc._add(acc.scalars, "rank_collapse_residual_l1inf",
                     metrics.rank_collapse_residual(output, norm="l1inf").sum())
            acc.n += output.shape[0]
            if example is not None and first_chunk[0] and example[0] == i:
                h = example[1]
                a1 = rec["attn"][0, h, :n_ex, :n_ex].detach().float().cpu()
                if differential:
                    a2 = rec["attn2"][0, h, :n_ex, :n_ex].detach().float().cpu()
                    lam = _float(rec["lambda_"])
                    example_maps.update(a1=a1.numpy(), a2=a2.numpy(), signed=(a1 - lam * a2).numpy())
                else:
                    example_maps["attn"] = a1.numpy()
            del rec
            if i == n_layer - 1:
                raise _StopForward

        return hook

    modules = list(model.modules())
    saved_training = [m.training for m in modules]
    saved_record = [(a.record, a.recorded) for a in attns]
    handles = []
    pool = ThreadPoolExecutor(threads, thread_name_prefix="analyze") if on_cpu and threads > 1 else None
    try:
        model.eval()
        for attn in attns:
            attn.record, attn.recorded = True, {}
        for i, block in enumerate(model.blocks):
            handles.append(block.register_forward_pre_hook(make_pre_hook(i), with_kwargs=True))
            handles.append(block.register_forward_hook(make_hook(i)))
        for start in range(0, B, batch_size):
            try:
                model(tokens[start : start + batch_size])
            except _StopForward:
                pass
            else:  # pragma: no cover - the last block always stops the pass
                raise RuntimeError("the analysis hooks did not run (is the model a coupled_qk GPT?)")
            first_chunk[0] = False
    finally:
        if pool is not None:
            pool.shutdown()
        for handle in handles:
            handle.remove()
        for attn, (flag, recorded) in zip(attns, saved_record):
            attn.record, attn.recorded = flag, recorded
        for m, flag in zip(modules, saved_training):
            m.training = flag

    layers = []
    for i, (attn, acc) in enumerate(zip(attns, accs)):
        n = acc.n
        heads = {k: (v / n).tolist() for k, v in acc.heads.items()}
        layer: dict = {"layer": i, "heads": _order_metrics(heads)}
        layer["spectrum"] = {k: [[float(f"{x:.6g}") for x in row] for row in (v / n).tolist()]
                             for k, v in acc.spectra.items()}
        qk: dict[str, list[float]] = {}
        dt = _dt_of(attn)
        if dt is not None:
            qk["dt"] = dt.to("cpu", torch.float64).tolist()
        qk.update({k: (v / n).tolist() for k, v in acc.qk.items()})
        layer["qk_heads"] = qk
        for key, value in acc.scalars.items():
            layer[key] = _float(value / n)
        if acc.lam is not None:
            layer["lambda"] = acc.lam
        mean = {k: _mean(v) for k, v in heads.items()}
        mean.update({k: _mean(v) for k, v in qk.items()})
        mean.update({k: layer[k] for k in acc.scalars})
        if acc.lam is not None:
            mean["lambda"] = acc.lam
        layer["mean"] = _order_metrics(mean)
        layers.append(layer)
    keys = list(dict.fromkeys(k for layer in layers for k in layer["mean"]))
    result = {
        "attention": variant,
        "n_layer": n_layer,
        "n_heads": config.n_heads,
        "n_map_heads": n_map_heads,
        "n_sequences": B,
        "seq_len": T,
        "config": config.to_dict(),
        "conventions": dict(CONVENTIONS),
        "rank_collapse_input": {k: _float(v / B) for k, v in input_rank.items()},
        "layers": layers,
        "mean": {k: _mean(layer["mean"][k] for layer in layers if k in layer["mean"]) for k in keys},
    }
    if example is not None:
        result["example"] = {"layer": example[0], "head": example[1], "sequence": 0, "tokens": n_ex,
                             "maps": example_maps}
    return result


def _metric_rank(key: str) -> tuple:
    prefix, _, base = key.rpartition("/")
    order = list(MAP_METRICS) + ["rank_collapse_residual", "rank_collapse_residual_l1inf", "dt", "q_update",
                                 "k_update", "lambda"]
    prefixes = ["", "a1", "a2", "signed"]
    return (order.index(base) if base in order else len(order), prefixes.index(prefix) if prefix in prefixes
            else len(prefixes), key)


def _order_metrics(d: dict) -> dict:
    return {k: d[k] for k in sorted(d, key=_metric_rank)}


# ----------------------------------------------------------------------------------------------------------
# checkpoints, text windows and reports
# ----------------------------------------------------------------------------------------------------------


def token_windows(text: str, tokenizer, n_sequences: int, seq_len: int) -> torch.Tensor:
    """The first ``n_sequences`` non-overlapping windows of ``seq_len`` tokens of ``text``.

    Only a prefix of ``text`` is encoded (grown until it yields ``n * seq_len`` tokens plus a 64-token margin,
    or is the whole text): byte-level BPE pre-tokenization is local, so the ids of the windows equal those of
    the whole text encoded at once (only the last pre-token before a cut can differ, and it lies in the
    margin).

    Args:
        text: the text (``str``).
        tokenizer: a :class:`coupled_qk.data.tokenizers.Tokenizer` (anything with ``encode(str) -> list[int]``).
        n_sequences: number of windows ``B >= 1``.
        seq_len: tokens per window ``T >= 2``.

    Returns:
        LongTensor ``(n_sequences, seq_len)``; row ``i`` is tokens ``[i * T, (i + 1) * T)`` of the text.

    Raises:
        ValueError: bad ``n_sequences`` / ``seq_len``, or the text has fewer than ``n_sequences * seq_len``
            tokens (the message gives the count).
    """
    for name, value, low in (("n_sequences", n_sequences, 1), ("seq_len", seq_len, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}; got {value!r}")
    if not isinstance(text, str):
        raise TypeError(f"text must be str; got {type(text).__name__}")
    need = n_sequences * seq_len
    margin = 64
    n_chars = min(len(text), max(4096, 8 * (need + margin)))
    while True:
        ids = tokenizer.encode(text[:n_chars])
        if len(ids) >= need + margin or n_chars >= len(text):
            break
        n_chars = min(len(text), 2 * n_chars)
    if len(ids) < need:
        raise ValueError(
            f"the text has only {len(ids)} tokens with this tokenizer; {n_sequences} windows of {seq_len} tokens "
            f"need {need} (lower n_sequences / seq_len)"
        )
    return torch.tensor(ids[:need], dtype=torch.long).view(n_sequences, seq_len)


def _find_tokenizer(ckpt: Path) -> Path:
    for where in (ckpt / "tokenizer", ckpt.parent / "tokenizer"):
        if (where / "tokenizer.json").is_file():
            return where
    raise FileNotFoundError(
        f"no tokenizer for checkpoint {ckpt}: expected {ckpt.parent / 'tokenizer' / 'tokenizer.json'} (the run "
        "folder's tokenizer, saved by training)"
    )


def _default_labels(ckpts: list[Path]) -> list[str]:
    labels = [c.parent.name if c.name.startswith("ckpt-") else c.name for c in ckpts]
    if len(set(labels)) < len(labels):
        labels = [f"{c.parent.name}/{c.name}" for c in ckpts]
    out, seen = [], {}
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label}#{seen[label]}")
    return out


def _json_ready(obj):
    if isinstance(obj, dict):
        return {str(k): _json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_ready(v) for v in obj]
    if isinstance(obj, (np.floating, np.integer)):
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Path):
        return str(obj)
    return obj


_NUMBER_LIST = re.compile(r"\[\n\s*([-+0-9.eE,\snul]*?)\n\s*\]")  # raw newlines never occur in JSON strings


def _dumps(obj) -> str:
    """JSON text of ``obj`` (non-finite floats -> null), indented, with lists of numbers kept on one line."""
    text = json.dumps(_json_ready(obj), indent=1, allow_nan=False)
    return _NUMBER_LIST.sub(lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text) + "\n"


def analyze_checkpoints(
    paths: Sequence[str | Path],
    corpus: str,
    split: str = "valid",
    n_sequences: int = 8,
    seq_len: int | None = None,
    data_dir: str | Path | None = None,
    out_dir: str | Path = "runs/analysis",
    *,
    labels: Sequence[str] | None = None,
    batch_size: int | None = None,
    example_layer: int | None = None,
    example_head: int = 0,
    example_tokens: int = 128,
    split_seed: int = 0,
    device: str | torch.device = "cpu",
    make_plots: bool = True,
    threads: int | None = None,
) -> dict:
    """Analyse several checkpoints on the same windows of a corpus split and write a report.

    Each path is a run folder (its ``latest`` checkpoint is used) or a checkpoint folder
    (:func:`coupled_qk.training.checkpoint.resolve_checkpoint`); the tokenizer is the run's,
    ``<run>/tokenizer`` (a checkpoint folder's parent is its run folder). The text is the ``split`` of
    :func:`coupled_qk.data.corpora.load_corpus` ``(corpus, data_dir, seed=split_seed)``; the windows are the
    first ``n_sequences`` non-overlapping windows of ``seq_len`` tokens from the start of the split
    (:func:`token_windows`). **The windows are the same text for every checkpoint only when the checkpoints
    share a tokenizer** (with different tokenizers the same number of tokens covers different amounts of
    text; ``analysis.json`` records each tokenizer's fingerprint, a hash of the token ids and the number of
    characters covered, and ``"same_tokenizer"``).

    Writes into ``out_dir`` (created): ``analysis.json`` (settings, conventions and, per checkpoint, its
    label, paths, progress state, tokenizer, text coverage, seconds and the :func:`analyze_model` result
    without the example map), the PNG figures of :func:`coupled_qk.analysis.plots.make_figures` (unless
    ``make_plots`` is False) and ``summary.md`` (:func:`summary_markdown`).

    Args:
        paths: one or more checkpoint or run folders.
        corpus: corpus name or path (see :func:`~coupled_qk.data.corpora.load_corpus`).
        split: ``"train"``, ``"valid"`` or ``"test"``.
        n_sequences: windows ``B >= 1``.
        seq_len: tokens per window (default: the smallest ``block_size`` of the checkpoints); must not exceed
            any checkpoint's ``block_size``.
        data_dir: data folder for named corpora.
        out_dir: output folder.
        labels: one label per path (default: the run folder names, made unique).
        batch_size: sequences per forward pass (default all; see :func:`analyze_model`).
        example_layer, example_head: the attention map drawn for each checkpoint (default: the middle layer,
            ``n_layer // 2`` of the shallowest model, head 0); example_tokens: its size (top-left square).
        split_seed: seed of the document-level split of corpora split at random (as the run's ``split_seed``).
        device: device for the models.
        make_plots: write the PNG figures.
        threads: heads analysed concurrently on CPU (see :func:`analyze_model`).

    Returns:
        The dict written to ``analysis.json`` plus ``"files"`` (paths of everything written).

    Raises:
        ValueError: no paths, label count mismatch, bad ``split`` / ``n_sequences`` / ``seq_len``, a text with
            too few tokens, a tokenizer whose ids exceed a model's vocabulary.
        FileNotFoundError: a checkpoint, tokenizer or corpus file is missing.
    """
    from coupled_qk.data.corpora import SPLITS, load_corpus
    from coupled_qk.data.tokenizers import Tokenizer
    from coupled_qk.models.config import GPTConfig
    from coupled_qk.training.checkpoint import load_checkpoint_model, resolve_checkpoint

    if isinstance(paths, (str, Path)):
        paths = [paths]
    paths = list(paths)
    if not paths:
        raise ValueError("paths is empty: give at least one checkpoint or run folder")
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not one of {SPLITS}")
    if isinstance(n_sequences, bool) or not isinstance(n_sequences, int) or n_sequences < 1:
        raise ValueError(f"n_sequences must be an int >= 1; got {n_sequences!r}")
    ckpts = [resolve_checkpoint(p) for p in paths]
    if labels is None:
        labels = _default_labels(ckpts)
    labels = [str(label) for label in labels]
    if len(labels) != len(ckpts):
        raise ValueError(f"got {len(labels)} labels for {len(ckpts)} checkpoints: give one label per checkpoint")
    if len(set(labels)) != len(labels):
        raise ValueError(f"labels must be unique; got {labels}")
    configs = [GPTConfig.load(c / "model_config.json") for c in ckpts]
    tok_dirs = [_find_tokenizer(c) for c in ckpts]
    tokenizers = [Tokenizer.load(d) for d in tok_dirs]
    min_block = min(c.block_size for c in configs)
    if seq_len is None:
        seq_len = min_block
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
        raise ValueError(f"seq_len must be an int >= 2 or None; got {seq_len!r}")
    if seq_len > min_block:
        worst = min(range(len(ckpts)), key=lambda i: configs[i].block_size)
        raise ValueError(f"seq_len={seq_len} exceeds block_size={min_block} of checkpoint {ckpts[worst]}")
    for tok, cfg, ckpt in zip(tokenizers, configs, ckpts):
        if tok.vocab_size > cfg.vocab_size:
            raise ValueError(f"the tokenizer of {ckpt} has {tok.vocab_size} ids but the model's vocab_size is "
                             f"{cfg.vocab_size}")
    if example_layer is None:
        example_layer = min(c.n_layer for c in configs) // 2

    text_corpus = load_corpus(corpus, data_dir, seed=split_seed)
    text = text_corpus.split(split)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    windows: dict[str, tuple[torch.Tensor, dict]] = {}
    entries, examples = [], []
    for label, path, ckpt, tok, tok_dir in zip(labels, paths, ckpts, tokenizers, tok_dirs):
        if tok.fingerprint not in windows:
            ids = token_windows(text, tok, n_sequences, seq_len)
            covered = len(tok.decode(ids.flatten().tolist()))
            digest = hashlib.sha256(ids.numpy().astype("<i8").tobytes()).hexdigest()
            windows[tok.fingerprint] = (ids, {"tokens": int(ids.numel()), "chars_covered": covered,
                                             "token_sha256": digest})
        ids, text_info = windows[tok.fingerprint]
        model, state = load_checkpoint_model(ckpt, map_location=device)
        t0 = time.perf_counter()
        result = analyze_model(model, ids, batch_size=batch_size, example=(example_layer, example_head),
                               example_tokens=example_tokens, threads=threads)
        seconds = time.perf_counter() - t0
        del model
        examples.append(result.pop("example"))
        entries.append({
            "label": label,
            "path": str(path),
            "checkpoint": str(ckpt),
            "run_dir": str(ckpt.parent),
            "state": state,
            "tokenizer": {"path": str(tok_dir), "name": tok.name, "fingerprint": tok.fingerprint,
                          "vocab_size": tok.vocab_size},
            "text": dict(text_info),
            "seconds": seconds,
            "analysis": result,
        })
    report = {
        "corpus": str(corpus),
        "corpus_source": text_corpus.source,
        "split": split,
        "split_seed": split_seed,
        "n_sequences": n_sequences,
        "seq_len": seq_len,
        "windows": "the first n_sequences non-overlapping windows of seq_len tokens from the start of the split; "
        "the same text for every checkpoint only when the tokenizers are the same",
        "same_tokenizer": len(windows) == 1,
        "example": {"layer": example_layer, "head": example_head, "sequence": 0},
        "conventions": dict(CONVENTIONS),
        "checkpoints": entries,
    }
    files: dict[str, str] = {}
    if make_plots:
        from coupled_qk.analysis.plots import make_figures

        figures = make_figures(entries, examples, out_dir)
        report["figures"] = {k: Path(v).name for k, v in figures.items()}
        files.update({k: str(v) for k, v in figures.items()})
    json_path = out_dir / "analysis.json"
    json_path.write_text(_dumps(report))
    md_path = out_dir / "summary.md"
    md_path.write_text(summary_markdown(report))
    files.update({"analysis.json": str(json_path), "summary.md": str(md_path)})
    report["files"] = files
    return report


# ----------------------------------------------------------------------------------------------------------
# markdown summary
# ----------------------------------------------------------------------------------------------------------

_DESCRIPTIONS = {
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
_MAP_NAMES = {"a1": "A1", "a2": "A2", "signed": "A1 - lambda A2"}

#: Metrics given a per-layer table in ``summary.md``.
PER_LAYER_TABLES = ("normalized_entropy", "effective_rank", "sink_mass", "rank_collapse_residual", "q_update")


def describe_metric(key: str) -> str:
    """Human-readable name of a metric key (``"a1/entropy"`` -> ``"attention entropy (nats) [A1]"``)."""
    prefix, _, base = key.rpartition("/")
    text = _DESCRIPTIONS.get(base, base)
    return f"{text} [{_MAP_NAMES.get(prefix, prefix)}]" if prefix else text


def _fmt(value) -> str:
    if value is None:
        return "–"
    value = float(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value != 0 and (abs(value) >= 1e4 or abs(value) < 1e-3):
        return f"{value:.3e}"
    return f"{value:.4f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return [line(header), "|" + "|".join(["---"] * len(header)) + "|"] + [line(row) for row in rows]


def summary_markdown(report: dict) -> str:
    """``summary.md``: checkpoints side by side (layer-averaged metrics, a few per-layer tables, conventions).

    Args:
        report: the dict :func:`analyze_checkpoints` writes to ``analysis.json``.

    Returns:
        Markdown text.
    """
    entries = report["checkpoints"]
    labels = [e["label"] for e in entries]
    lines = [
        "# Attention diagnostics",
        "",
        f"Corpus `{report['corpus']}`, split `{report['split']}`: {report['n_sequences']} sequences x "
        f"{report['seq_len']} tokens, the first non-overlapping windows from the start of the split.",
        "",
    ]
    if report["same_tokenizer"]:
        lines += ["All checkpoints share one tokenizer, so every checkpoint saw exactly the same text.", ""]
    else:
        lines += ["**The checkpoints use different tokenizers**: the windows hold the same number of tokens "
                  "but not the same text (see 'chars covered').", ""]
    lines += ["## Checkpoints", ""]
    rows = []
    for e in entries:
        a = e["analysis"]
        step = e["state"].get("step", "–") if isinstance(e["state"], dict) else "–"
        rows.append([e["label"], a["attention"], str(step), f"`{e['checkpoint']}`",
                     f"{e['tokenizer']['name']} ({e['tokenizer']['fingerprint'][:8]})",
                     str(e["text"]["chars_covered"]), f"{e['seconds']:.1f}"])
    lines += _table(["label", "attention", "step", "checkpoint", "tokenizer", "chars covered", "seconds"], rows)
    lines += ["", "## Layer-averaged metrics", "",
              "Mean over layers of the per-layer means over heads (each per-map value averaged over sequences).",
              ""]
    keys = sorted({k for e in entries for k in e["analysis"]["mean"]}, key=_metric_rank)
    rows = [[describe_metric(k)] + [_fmt(e["analysis"]["mean"].get(k)) for e in entries] for k in keys]
    rows.append(["rank-collapse residual of the embeddings (Frobenius)"]
                + [_fmt(e["analysis"]["rank_collapse_input"]["fro"]) for e in entries])
    lines += _table(["metric"] + labels, rows)
    for base in PER_LAYER_TABLES:
        present = [k for k in keys if k.rpartition("/")[2] == base]
        if not present:
            continue
        lines += ["", f"## Per layer: {_DESCRIPTIONS[base]}", ""]
        header, columns = ["layer"], []
        for key in present:
            for e in entries:
                if key in e["analysis"]["mean"]:
                    prefix = key.rpartition("/")[0]
                    header.append(e["label"] + (f" {_MAP_NAMES[prefix]}" if prefix else ""))
                    columns.append([layer["mean"].get(key) for layer in e["analysis"]["layers"]])
        depth = max(len(c) for c in columns)
        rows = [[str(i)] + [_fmt(c[i]) if i < len(c) else "–" for c in columns] for i in range(depth)]
        lines += _table(header, rows)
    if report.get("figures"):
        lines += ["", "## Figures", ""]
        lines += [f"- {name}: ![{name}]({file})" for name, file in report["figures"].items()]
    lines += ["", "## Conventions", ""]
    lines += [f"- **{k}**: {v}" for k, v in report["conventions"].items()]
    return "\n".join(lines) + "\n"

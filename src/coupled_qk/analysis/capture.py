"""Capture of attention diagnostics from a GPT forward pass (docs/METHOD.md section 7).

:func:`analyze_model` runs the blocks of a :class:`~coupled_qk.models.gpt.GPT` over a batch of token windows
with :meth:`~coupled_qk.models.gpt.GPT.trace` (the eager attention path, one
:class:`~coupled_qk.layers.attention.AttentionRecord` per block) and computes, per layer and per head, the
diagnostics of :mod:`coupled_qk.analysis.attention_stats`:

* attention entropy (nats, mean over all rows) and normalised entropy (row ``i`` divided by
  ``log(i + 1)``, row 0 excluded), attention-sink mass on the first key (row 0 excluded), the effective rank
  (Roy & Vetterli 2007), the singular-value spectrum and the spectral gap ``sigma1/sigma2`` and
  ``(sigma1 - sigma2)/sigma1`` of every attention map;
* the rank-collapse residual (Dong et al. 2021) of every block's output ``(B, T, d_model)`` (relative Frobenius distance
from the nearest ``1 x^T``, and the l1/l_inf
  variant), plus the same for the embedding output that enters block 0;
* for attentions with a query-key map, the map's learned step size ``dt`` per head (``AttentionRecord.dt``)
  and the relative update sizes ``|q' - q| / |q|`` and ``|k' - k| / |k|`` of the map (mean over tokens;
  ``uncoupled_mlp`` leaves keys untouched, so its key update is exactly 0);
* for differential scoring (``differential``, ``coupled_differential``, ...): both softmax maps ``A1`` and
  ``A2`` (keys ``a1/...`` and ``a2/...``) and, for the signed map ``A1 - lambda A2``, only the spectrum,
  effective rank and spectral gap (keys ``signed/...``): the signed map is not a probability matrix, so
  entropies and sink mass are undefined for it (the convention of
  :func:`coupled_qk.analysis.attention_stats.summarize_differential_attention`).

Every per-map value is computed for each sequence and then averaged over the sequences (so a value is the
mean over the batch of the per-map diagnostic, e.g. the mean of the per-map ratios ``sigma1/sigma2``);
per-layer values are means over heads, model values are means over layers.

:func:`coupled_qk.analysis.analyze.analyze_checkpoints` does this for several checkpoints.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np
import torch

from coupled_qk.analysis import attention_stats
from coupled_qk.analysis.conventions import CONVENTIONS, as_float, mean_of, order_metrics
from coupled_qk.checks.values import positive_int
from coupled_qk.layers.attention import AttentionRecord
from coupled_qk.models.registry import get_attention

__all__ = ["analyze_model", "token_windows"]


def check_finite_parameters(model, name: str = "model") -> None:
    """``ValueError`` naming the parameters of ``model`` (an ``nn.Module``) that hold NaN or inf, the first five
    and their count: its attention maps would be non-finite, and no diagnostic of them is defined."""
    bad = [n for n, p in model.named_parameters() if not bool(torch.isfinite(p.detach()).all())]
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise ValueError(
            f"{name} has non-finite (NaN or inf) parameters: {shown} ({len(bad)} of "
            f"{sum(1 for _ in model.parameters())}); its attention maps are undefined, analyse a "
            "model (checkpoint) with finite weights"
        )


def check_finite_activations(layer: int, tensors: dict) -> None:
    """``ValueError`` naming layer ``layer`` and which of ``tensors`` (name -> tensor or ``None``) hold NaN or inf;
    called once the parameters are known finite, so the activations overflowed (no diagnostic is defined)."""
    bad = [name for name, t in tensors.items() if t is not None and not bool(torch.isfinite(t).all())]
    if bad:
        dtype = next(t for t in tensors.values() if t is not None).dtype
        raise ValueError(
            f"layer {layer}: the {' and '.join(bad)} hold NaN or inf although every parameter is finite "
            f"(the activations overflow in {dtype} on these tokens); no diagnostic is defined for them"
        )


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
        raise TypeError(f"model must be a coupled_qk GPT (with .blocks[i].attn); got {type(model).__name__}")
    return [b.attn for b in blocks]


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


def _accumulate_maps(
    acc: _LayerAccumulator, rec: AttentionRecord, differential: bool, pool: ThreadPoolExecutor | None
) -> None:
    """Per-head map diagnostics of one recorded layer, summed over the batch into ``acc``."""
    A1 = rec.attn
    n_heads = A1.shape[1]

    def one_head(h: int) -> dict[str, torch.Tensor]:  # one head bounds the float64 working set to (B, T, T)
        if differential:
            return attention_stats.summarize_differential_attention(A1[:, h], rec.attn2[:, h], rec.lam)
        return attention_stats.summarize_attention(A1[:, h])

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
        acc.lam = as_float(rec.lam)


def _accumulate_qk(acc: _LayerAccumulator, rec: AttentionRecord) -> None:
    """Relative update sizes of the query-key map, summed over the batch into ``acc`` (no-op without a map)."""
    if rec.q is None:
        return
    acc._add(acc.qk, "q_update", attention_stats.relative_update(rec.q_mapped, rec.q).sum(dim=0))
    acc._add(acc.qk, "k_update", attention_stats.relative_update(rec.k_mapped, rec.k).sum(dim=0))


def _resolve_example(example, n_layer: int, n_map_heads: int) -> tuple[int, int] | None:
    if example is None:
        return None
    try:  # operator.index: ints only (a float such as 0.7 is refused, not truncated), bools refused below
        layer, head = (operator.index(v) for v in example)
        if any(isinstance(v, bool) for v in example):
            raise TypeError
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
        raise ValueError(
            f"tokens must hold sequences of T >= 2 tokens (normalised entropy and sink mass exclude "
            f"row 0); got shape {tuple(tokens.shape)}"
        )
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
    """Per-layer, per-head attention diagnostics of ``model`` on ``tokens`` (docs/METHOD.md section 7).

    The blocks run through :meth:`~coupled_qk.models.gpt.GPT.trace` (the eager attention path): each block's
    :class:`~coupled_qk.layers.attention.AttentionRecord` and output are turned into metrics as soon as the
    block has run, then dropped (memory stays at one layer's maps); the final LayerNorm and output head are
    never computed. Every module's ``training`` flag is restored afterwards, also when an error occurs; the
    model's parameters are never modified and no state is left on it. Dropout is off during the analysis
    (``model.eval()``).

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
            ``example_tokens``; a parameter of ``model`` holding NaN or inf (named), or activations that
            overflow (the layer named); attention maps that are not causal probability maps (metrics checks).
    """
    capture = _Capture(model, tokens, batch_size, example, example_tokens, threads)
    capture.run(model)
    return capture.result()


class _Capture:
    """One :func:`analyze_model` call: its checked arguments (checked in the order of the signature) and the
    per-layer running sums its traced blocks feed."""

    def __init__(self, model, tokens, batch_size, example, example_tokens, threads) -> None:
        n_layer = len(_attention_layers(model))
        self.config = config = model.config
        tokens = _check_tokens(tokens, config)
        check_finite_parameters(model)
        self.B, self.T = tokens.shape
        self.batch_size = self.B if batch_size is None else batch_size
        positive_int("batch_size", self.batch_size)
        positive_int("example_tokens", example_tokens)
        self.threads = torch.get_num_threads() if threads is None else threads
        positive_int("threads", self.threads)
        attention = get_attention(config.attention)
        self.differential = attention.scoring == "differential"
        self.n_map_heads = config.n_heads // attention.head_group
        self.example = _resolve_example(example, n_layer, self.n_map_heads)
        device = next(model.parameters()).device
        self.tokens, self.on_cpu = tokens.to(device), device.type == "cpu"
        self.accs = [_LayerAccumulator() for _ in range(n_layer)]
        self.input_rank = {"fro": torch.zeros((), dtype=torch.float64), "l1inf": torch.zeros((), dtype=torch.float64)}
        self.example_maps: dict[str, np.ndarray] = {}
        self.n_ex = min(self.T, example_tokens)
        self.dts: dict[int, torch.Tensor] = {}
        self.pool = None

    def run(self, model) -> None:
        """Trace every chunk of ``batch_size`` sequences in eval mode, restoring each module's ``training``
        flag afterwards (also on error)."""
        modules = list(model.modules())
        saved_training = [m.training for m in modules]
        if self.on_cpu and self.threads > 1:
            self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="analyze")
        try:
            model.eval()
            for start in range(0, self.B, self.batch_size):
                steps: Iterator = model.trace(self.tokens[start : start + self.batch_size])
                for step in steps:  # each block's record is consumed and dropped before the next block runs
                    self.consume(step, start == 0)
        finally:
            if self.pool is not None:
                self.pool.shutdown()
            for m, flag in zip(modules, saved_training):
                m.training = flag

    def consume(self, step, first_chunk: bool) -> None:
        """Add one traced block's record and output to its layer's sums."""
        i, rec, output, acc = step.layer, step.record, step.output, self.accs[step.layer]
        check_finite_activations(
            i,
            {
                "block input (embeddings)": step.input if i == 0 else None,
                "attention maps": rec.attn,
                "second maps (A2)": rec.attn2,
                "block output": output,
            },
        )
        if i == 0:
            self.input_rank["fro"] += attention_stats.rank_collapse_residual(step.input).sum().cpu()
            self.input_rank["l1inf"] += attention_stats.rank_collapse_residual(step.input, norm="l1inf").sum().cpu()
        with _single_threaded(self.on_cpu):
            _accumulate_maps(acc, rec, self.differential, self.pool)
        _accumulate_qk(acc, rec)
        if rec.dt is not None:
            self.dts[i] = rec.dt
        acc._add(acc.scalars, "rank_collapse_residual", attention_stats.rank_collapse_residual(output).sum())
        acc._add(
            acc.scalars,
            "rank_collapse_residual_l1inf",
            attention_stats.rank_collapse_residual(output, norm="l1inf").sum(),
        )
        acc.n += output.shape[0]
        if self.example is not None and first_chunk and self.example[0] == i:
            self.example_maps.update(_example_maps(rec, self.example[1], self.n_ex, self.differential))

    def result(self) -> dict:
        """The dict :func:`analyze_model` returns."""
        layers = [_layer_summary(i, acc, self.dts.get(i)) for i, acc in enumerate(self.accs)]
        result = _model_summary(self.config, self.n_map_heads, self.B, self.T, self.input_rank, layers)
        if self.example is not None:
            result["example"] = {
                "layer": self.example[0],
                "head": self.example[1],
                "sequence": 0,
                "tokens": self.n_ex,
                "maps": self.example_maps,
            }
        return result


def _example_maps(rec: AttentionRecord, head: int, n: int, differential: bool) -> dict[str, np.ndarray]:
    """The top-left ``n x n`` attention map(s) of sequence 0 and map head ``head`` of ``rec``, float32 numpy:
    ``attn``, or ``a1``, ``a2`` and ``signed`` (``A1 - lambda A2``) for differential scoring."""
    a1 = rec.attn[0, head, :n, :n].detach().float().cpu()
    if not differential:
        return {"attn": a1.numpy()}
    a2 = rec.attn2[0, head, :n, :n].detach().float().cpu()
    lam = as_float(rec.lam)
    return {"a1": a1.numpy(), "a2": a2.numpy(), "signed": (a1 - lam * a2).numpy()}


def _model_summary(
    config, n_map_heads: int, n_sequences: int, seq_len: int, input_rank: dict, layers: list[dict]
) -> dict:
    """The result of :func:`analyze_model` without its example: the model's shape, the per-layer summaries, the
    embedding output's rank-collapse residuals (sums over ``n_sequences``) and every layer mean averaged over
    layers."""
    keys = list(dict.fromkeys(k for layer in layers for k in layer["mean"]))
    return {
        "attention": config.attention,
        "n_layer": len(layers),
        "n_heads": config.n_heads,
        "n_map_heads": n_map_heads,
        "n_sequences": n_sequences,
        "seq_len": seq_len,
        "config": config.to_dict(),
        "conventions": dict(CONVENTIONS),
        "rank_collapse_input": {k: as_float(v / n_sequences) for k, v in input_rank.items()},
        "layers": layers,
        "mean": {k: mean_of(layer["mean"][k] for layer in layers if k in layer["mean"]) for k in keys},
    }


def _layer_summary(i: int, acc, dt: torch.Tensor | None) -> dict:
    """Layer ``i``'s entry of :func:`analyze_model`: the accumulated sums of ``acc`` divided by its sequence count
    (per head, spectra, query-key metrics with ``dt``, scalars, lambda) and their means over heads."""
    n = acc.n
    heads = {k: (v / n).tolist() for k, v in acc.heads.items()}
    layer: dict = {"layer": i, "heads": order_metrics(heads)}
    layer["spectrum"] = {
        k: [[float(f"{x:.6g}") for x in row] for row in (v / n).tolist()] for k, v in acc.spectra.items()
    }
    qk: dict[str, list[float]] = {}
    if dt is not None:
        qk["dt"] = dt.to("cpu", torch.float64).tolist()
    qk.update({k: (v / n).tolist() for k, v in acc.qk.items()})
    layer["qk_heads"] = qk
    for key, value in acc.scalars.items():
        layer[key] = as_float(value / n)
    if acc.lam is not None:
        layer["lambda"] = acc.lam
    mean = {k: mean_of(v) for k, v in heads.items()}
    mean.update({k: mean_of(v) for k, v in qk.items()})
    mean.update({k: layer[k] for k in acc.scalars})
    if acc.lam is not None:
        mean["lambda"] = acc.lam
    layer["mean"] = order_metrics(mean)
    return layer


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

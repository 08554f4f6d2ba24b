"""MQAR sweeps over attention variants, model widths and learning rates (Zoology's figure-2 protocol).

Source: Arora, Eyuboglu et al., "Zoology", arXiv:2312.04927 (HazyResearch/zoology, tag ``iclr24``,
``zoology/experiments/iclr24_zoology_figure2/configs.py``); PAPER.md section 6 and claim C12.

Models: attention-only blocks (``use_mlp=False``), 2 layers, 1 head, learned absolute positions, a sweep of
``d_model``; every attention variant of the library (:data:`MQAR_VARIANTS`). Differential variants pair
heads into sub-heads, so a sweep with an odd head count gives them twice the heads (one differential head =
two sub-heads of width ``d_model / 2``, parameter-matched to one standard head).

Protocol: AdamW (weight decay 0.1 on matrices), cosine decay to 0 without warmup (Zoology's
``CosineAnnealingLR(eta_min=0)``), early stop when the test accuracy reaches 0.99, a sweep of learning
rates of which the best final accuracy is reported, accuracy = argmax-correct over the query positions,
also per (L, K) slice. Every run goes through the project's one training loop
(:func:`coupled_qk.training.loop.train`) with :class:`coupled_qk.training.mqar_task.MQARTask`.

Presets (:data:`SWEEP_PRESETS`):

* ``zoology-fig2``: the paper sweep, one difficulty per (L, K) in (64,4), (128,8), (256,16), (512,64),
  100k train / 3k test, V = 8192, d_model 64..512, 4 learning rates log-spaced 1e-4..1e-2, 64 epochs,
  Zoology's batch sizes (512, 512, 256, 128). GPU-scale.
* ``based-mixture``: the MQAR mixture of Based (Arora et al. 2024, arXiv:2402.18668, Zoology
  ``experiments/paper_configs/arxiv24_based_figure2/configs.py``): train on (64,4) x 100k, (128,8),
  (256,16), (256,32), (256,64) x 20k each; test on (64,4), (64,8), (64,16), (128,32), (256,64),
  (512,128), (1024,256) x 1k each; batch 256; 4 learning rates log-spaced 1e-3..10^-1.5; 32 epochs;
  d_model 64 and 128. Our choice: RoPE instead of learned positions, because learned position embeddings
  past the longest training length (256) would never be trained (Based's models use no position
  embeddings and a short convolution instead).
* ``cpu``: a reduced sweep (ours) designed by experiment to finish in under 20 minutes on 2 shared CPU
  cores: V = 64, L = 16 with K = 2 / 3 / 4 (easy / medium / hard), 20k train / 500 test, d_model 32 and
  64, learning rates 2e-3 and 4e-3, batch 64, at most 600 steps, one torch thread. In pilots on this
  budget, 2-layer attention first sits on a plateau at about 1/K accuracy (it outputs one of the K values
  in the context) and then escapes abruptly; the escape happened after 300-800 steps at d_model 64 and lr
  ~3e-3, never at lr 1e-2 or d_model 32 within 800 steps, and its timing changes with data order and seed,
  so one run per cell is a noisy measurement (see the preset's ``notes``).

Zoology settings we do not copy: its MHA has attention dropout 0.1 (``GPTConfig.dropout`` would also drop
embeddings and residual branches, so all presets train without dropout) and biases in the projections
(ours are bias-free).
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from coupled_qk.models.variants import MAIN_VARIANTS, VARIANTS, parse_variants, variant_attention, variant_overrides
from coupled_qk.training.config import TrainConfig
from coupled_qk.training.mqar_task import parse_slices, steps_per_epoch

__all__ = [
    "MQAR_VARIANTS",
    "SWEEP_PRESETS",
    "Difficulty",
    "SweepPreset",
    "best_over_lr",
    "format_table",
    "get_preset",
    "heads_for",
    "parse_variants",
    "plan_runs",
    "plot_results",
    "run_config",
    "run_sweep",
    "summarize",
]

MQAR_VARIANTS: dict[str, dict] = {name: VARIANTS[name] for name in MAIN_VARIANTS}
"""Default sweep variants -> ``GPTConfig`` overrides: the paper's variants and baselines (every attention of the
registry except the ``uncoupled_mlp_differential`` grid cell) plus coupled with the leapfrog integrator
(``coupled`` is the paper's Euler integrator). Any spec of :mod:`coupled_qk.models.variants` works."""


@dataclass(frozen=True)
class Difficulty:
    """One (L, K) setting of a sweep: its training and test slices and batch size.

    Attributes:
        name: short label used in tables, plots and folder names (e.g. ``"easy"`` or ``"L64_K4"``).
        train_slices: ``((L, K, N), ...)`` training slices (batches never mix slices).
        test_slices: ``((L, K, N), ...)`` test slices (accuracy is reported overall and per slice).
        batch_size: sequences per optimiser step.

    Raises:
        ValueError: malformed slices (see :func:`coupled_qk.training.mqar_task.parse_slices`) or
            ``batch_size`` < 1.
    """

    name: str
    train_slices: tuple
    test_slices: tuple
    batch_size: int

    def __post_init__(self):
        object.__setattr__(self, "train_slices", tuple(parse_slices(self.train_slices, f"{self.name}.train_slices")))
        object.__setattr__(self, "test_slices", tuple(parse_slices(self.test_slices, f"{self.name}.test_slices")))
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"Difficulty {self.name!r}: batch_size={self.batch_size!r} must be a positive integer")

    @property
    def label(self) -> str:
        """``name`` with the (L, K) training slices, e.g. ``"easy (L64_K4)"``."""
        slices = "+".join(f"L{L}_K{K}" for L, K, _ in self.train_slices)
        return self.name if self.name == slices else f"{self.name} ({slices})"


@dataclass(frozen=True)
class SweepPreset:
    """A full MQAR sweep: data, models, optimiser and budget.

    Attributes:
        name: preset name.
        description: one paragraph (printed and stored in the results).
        vocab_size: V.
        difficulties: the (L, K) settings, in run order.
        d_models: model widths.
        lrs: peak learning rates (the best final accuracy over them is reported).
        variants: names from :data:`MQAR_VARIANTS`.
        epochs: training length in epochs over the training slices (the cosine schedule's horizon).
        max_steps: optional cap on the steps of a run (also the schedule's horizon when smaller).
        eval_interval: steps between quick evaluations (early stopping is checked there); ``None`` = once
            per epoch, as Zoology.
        quick_eval_examples: test rows per slice for the quick evaluation (``None`` = all); the final
            accuracy always uses the full test set.
        eval_batch_size: rows per evaluation forward pass (``None``: the training batch size).
        n_layer, n_heads, position, dropout: model shape (``use_mlp=False`` always).
        warmup_steps, min_lr_ratio, weight_decay, beta2, grad_clip: optimiser (Zoology: no warmup, cosine to
            0, weight decay 0.1, PyTorch AdamW betas (0.9, 0.999), no clipping).
        early_stop: accuracy at which a run stops (Zoology 0.99).
        data_seed, seed: data and model/batch-order seeds.
        threads: torch CPU threads the command uses by default (``None``: torch's choice); the cpu preset uses 1,
            which measured faster than 2 on a shared 2-core machine for these tiny models.
        notes: free-form lines stored with the results.
    """

    name: str
    description: str
    vocab_size: int
    difficulties: tuple
    d_models: tuple
    lrs: tuple
    variants: tuple = tuple(MQAR_VARIANTS)
    epochs: float = 64.0
    max_steps: int | None = None
    eval_interval: int | None = None
    quick_eval_examples: int | None = None
    eval_batch_size: int | None = None
    n_layer: int = 2
    n_heads: int = 1
    position: str = "learned"
    dropout: float = 0.0
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.1
    beta2: float = 0.999
    grad_clip: float = 0.0
    early_stop: float = 0.99
    data_seed: int = 123
    seed: int = 0
    threads: int | None = None
    notes: tuple = field(default_factory=tuple)

    def to_dict(self) -> dict:
        """Plain-JSON description of the preset."""
        d = dataclasses.asdict(self)
        d["difficulties"] = [dataclasses.asdict(x) for x in self.difficulties]
        return json.loads(json.dumps(d))

    def difficulty(self, name: str) -> Difficulty:
        """The difficulty called ``name``; ``ValueError`` listing the valid names otherwise."""
        for d in self.difficulties:
            if d.name == name:
                return d
        raise ValueError(f"difficulty {name!r} is not in preset {self.name!r}; expected one of "
                         f"{[d.name for d in self.difficulties]}")


def _logspace(lo: float, hi: float, n: int) -> tuple:
    return tuple(float(f"{10 ** (math.log10(lo) + i * (math.log10(hi) - math.log10(lo)) / (n - 1)):.3g}")
                 for i in range(n))


_ZOOLOGY_BATCH = {64: 512, 128: 512, 256: 256, 512: 128}

SWEEP_PRESETS: dict[str, SweepPreset] = {
    "zoology-fig2": SweepPreset(
        name="zoology-fig2",
        description="Zoology figure 2 (arXiv:2312.04927): (L, K) in (64,4), (128,8), (256,16), (512,64); 100k train / "
        "3k test; V=8192; 2 attention-only layers, 1 head, learned positions; d_model 64..512; 4 learning "
        "rates log-spaced 1e-4..1e-2; 64 epochs; AdamW wd 0.1; cosine; early stop at 0.99. GPU-scale.",
        vocab_size=8192,
        difficulties=tuple(
            Difficulty(f"L{L}_K{K}", ((L, K, 100_000),), ((L, K, 3_000),), _ZOOLOGY_BATCH[L])
            for L, K in ((64, 4), (128, 8), (256, 16), (512, 64))
        ),
        d_models=(64, 128, 256, 512),
        lrs=_logspace(1e-4, 1e-2, 4),
        epochs=64.0,
        notes=("Zoology's MHA uses attention dropout 0.1; GPTConfig.dropout would also drop embeddings and "
               "residual branches, so we train without dropout.",
               "Differential variants use n_heads=2 (one differential head of two sub-heads, parameter-matched "
               "to one standard head).",),
    ),
    "based-mixture": SweepPreset(
        name="based-mixture",
        description="Based figure 2 MQAR mixture (arXiv:2402.18668; Zoology arxiv24_based_figure2 configs): train "
        "(64,4)x100k + (128,8),(256,16),(256,32),(256,64) x20k; test (64,4),(64,8),(64,16),(128,32),(256,64),"
        "(512,128),(1024,256) x1k; V=8192; batch 256; 4 learning rates log-spaced 1e-3..10^-1.5; 32 epochs.",
        vocab_size=8192,
        difficulties=(
            Difficulty(
                "mixture",
                ((64, 4, 100_000), (128, 8, 20_000), (256, 16, 20_000), (256, 32, 20_000), (256, 64, 20_000)),
                ((64, 4, 1_000), (64, 8, 1_000), (64, 16, 1_000), (128, 32, 1_000), (256, 64, 1_000),
                 (512, 128, 1_000), (1024, 256, 1_000)),
                256,
            ),
        ),
        d_models=(64, 128),
        lrs=_logspace(1e-3, 10 ** -1.5, 4),
        epochs=32.0,
        eval_batch_size=32,
        position="rope",
        notes=("Our choice: RoPE instead of learned positions; learned embeddings beyond the longest training "
               "length (256) would stay untrained at test lengths 512 and 1024. Based's own models use no "
               "position embeddings (a short convolution provides local position).",
               "Test batch 32 as in Zoology (logits of 1024-token sequences over V=8192 are large).",),
    ),
    "cpu": SweepPreset(
        name="cpu",
        description="CPU-sized sweep (ours, chosen by experiment): V=64; L=16 with K=2 (easy), 3 (medium), 4 (hard); "
        "20k train / 500 test per difficulty; 2 attention-only layers, 1 head, learned positions; d_model 32 and "
        "64; learning rates 2e-3 and 4e-3; batch 64; at most 600 steps (cosine to 0); early stop at 0.99.",
        vocab_size=64,
        difficulties=(
            Difficulty("easy", ((16, 2, 20_000),), ((16, 2, 500),), 64),
            Difficulty("medium", ((16, 3, 20_000),), ((16, 3, 500),), 64),
            Difficulty("hard", ((16, 4, 20_000),), ((16, 4, 500),), 64),
        ),
        d_models=(32, 64),
        lrs=(2e-3, 4e-3),
        epochs=64.0,
        max_steps=600,
        eval_interval=100,
        quick_eval_examples=None,
        threads=1,
        notes=("Differential variants use n_heads=2 (one differential head of two sub-heads, parameter-matched "
               "to one standard head).",
               "Budget-bound: 600 steps x 64 sequences; on 2 shared CPU cores the 72 runs take about 15 minutes. "
               "Pilots: 2-layer attention sits on the 1/K plateau (it picks one of the K values in context) and "
               "escapes abruptly (induction-style) after 300-800 steps at d_model 64 and lr ~3e-3, not at all at "
               "lr 1e-2 or d_model 32 within 800 steps; the step of the escape varies with data order and seed.",
               "One seed per cell: differences between variants are within run-to-run variation unless large.",),
    ),
}


def get_preset(name: str) -> SweepPreset:
    """The preset called ``name``; ``ValueError`` listing the valid names otherwise."""
    if name not in SWEEP_PRESETS:
        raise ValueError(f"unknown MQAR sweep preset {name!r}; expected one of {sorted(SWEEP_PRESETS)}")
    return SWEEP_PRESETS[name]


def _in_variant_order(names) -> list[str]:
    """``names`` in :data:`MQAR_VARIANTS` order, other specs after them alphabetically."""
    rank = {v: i for i, v in enumerate(MQAR_VARIANTS)}
    return sorted(set(names), key=lambda v: (rank.get(v, len(rank)), v))


def heads_for(variant: str, n_heads: int) -> int:
    """Heads for ``variant``: ``2 * n_heads`` for differential variants when ``n_heads`` is odd, else ``n_heads``.

    A differential head is a pair of sub-heads of width ``d_model / n_heads``; doubling an odd head count keeps
    the parameter count of the attention projections equal to the standard model's.
    """
    group = variant_attention(variant).head_group
    return group * n_heads if n_heads % group else n_heads


def _lr_tag(lr: float) -> str:
    return f"lr{lr:.3g}"


def run_config(preset: SweepPreset, difficulty: Difficulty, variant: str, d_model: int, lr: float,
               out_dir: str | Path, device: str = "auto", cache_dir: str | Path | None = None) -> TrainConfig:
    """The :class:`TrainConfig` of one sweep run (``task="mqar"``), written to ``<out_dir>/<difficulty>/<variant>/
    d<d_model>/lr<lr>``.

    The step budget is ``ceil(epochs * steps_per_epoch)``, capped by ``preset.max_steps``; evaluation runs every
    ``preset.eval_interval`` steps (or once per epoch) and the run stops early at ``preset.early_stop`` accuracy.

    Raises:
        ValueError: unknown variant, or an invalid resulting configuration (from :class:`TrainConfig`).
    """
    overrides = variant_overrides(variant)  # raises ValueError naming an unknown variant
    per_epoch = steps_per_epoch(difficulty.train_slices, difficulty.batch_size)
    max_steps = max(1, math.ceil(preset.epochs * per_epoch))
    if preset.max_steps is not None:
        max_steps = min(max_steps, preset.max_steps)
    eval_interval = preset.eval_interval or max(1, round(per_epoch))
    model = dict(
        n_layer=preset.n_layer, d_model=d_model, n_heads=heads_for(variant, preset.n_heads), use_mlp=False,
        position=preset.position, dropout=preset.dropout, **overrides,
    )
    options = dict(
        vocab_size=preset.vocab_size,
        train_slices=[list(s) for s in difficulty.train_slices],
        test_slices=[list(s) for s in difficulty.test_slices],
        data_seed=preset.data_seed,
        quick_eval_examples=preset.quick_eval_examples,
    )
    if preset.eval_batch_size is not None:
        options["eval_batch_size"] = preset.eval_batch_size
    if cache_dir is not None:
        options["cache_dir"] = str(cache_dir)
    run_dir = Path(out_dir) / difficulty.name / variant / f"d{d_model}" / _lr_tag(lr)
    return TrainConfig(
        task="mqar", preset="tiny", model=model, batch_size=difficulty.batch_size, lr=float(lr),
        min_lr_ratio=preset.min_lr_ratio, warmup_steps=preset.warmup_steps, weight_decay=preset.weight_decay,
        beta2=preset.beta2, grad_clip=preset.grad_clip, max_steps=max_steps, eval_interval=eval_interval,
        log_interval=max(1, min(50, eval_interval)), early_stop_metric="valid/accuracy",
        early_stop_value=preset.early_stop, seed=preset.seed, device=device, out_dir=str(run_dir), resume=True,
        tensorboard=False, progress=False, task_options=options,
    )


@dataclass(frozen=True)
class PlannedRun:
    """One (difficulty, d_model, lr, variant) point of a sweep."""

    difficulty: Difficulty
    variant: str
    d_model: int
    lr: float


def plan_runs(preset: SweepPreset, variants=None, d_models=None, lrs=None, difficulties=None) -> list[PlannedRun]:
    """All runs of a sweep, ordered difficulty -> d_model -> lr -> variant (so a time guard cuts whole blocks of
    variants, never one variant alone). Arguments default to the preset's values.

    Raises:
        ValueError: unknown variant or difficulty, or a non-positive d_model or lr.
    """
    variants = parse_variants(variants) if variants is not None else list(preset.variants)
    d_models = list(d_models) if d_models is not None else list(preset.d_models)
    lrs = list(lrs) if lrs is not None else list(preset.lrs)
    diffs = [preset.difficulty(n) for n in difficulties] if difficulties is not None else list(preset.difficulties)
    for d in d_models:
        if isinstance(d, bool) or not isinstance(d, int) or d < 1:
            raise ValueError(f"d_model={d!r} must be a positive integer")
    for lr in lrs:
        if not (isinstance(lr, (int, float)) and lr > 0 and math.isfinite(lr)):
            raise ValueError(f"lr={lr!r} must be a finite number > 0")
    return [PlannedRun(diff, v, d, float(lr)) for diff in diffs for d in d_models for lr in lrs for v in variants]


def _record(run: PlannedRun, cfg: TrainConfig, results: dict, status: str, seconds: float) -> dict:
    final = results.get("final", {})
    model_cfg = results.get("model_config", {})
    return {
        "difficulty": run.difficulty.name,
        "variant": run.variant,
        "d_model": run.d_model,
        "lr": run.lr,
        "n_heads": model_cfg.get("n_heads"),
        "params": results.get("params"),
        "accuracy": final.get("valid/accuracy"),
        "slices": {k.split("/", 2)[2]: v for k, v in final.items() if k.startswith("valid/accuracy/")},
        "steps": results.get("steps"),
        "max_steps": cfg.max_steps,
        "stop_reason": results.get("stop_reason"),
        "train_seconds": results.get("train_seconds"),
        "seconds": seconds,
        "status": status,
        "run_dir": cfg.out_dir,
        "config": cfg.to_dict(),
    }


def run_sweep(
    preset: SweepPreset,
    out_dir: str | Path,
    variants=None,
    d_models=None,
    lrs=None,
    difficulties=None,
    device: str = "auto",
    max_minutes: float | None = None,
    log: Callable[[str], None] = print,
    train_fn: Callable | None = None,
) -> dict:
    """Run (or reuse) every run of a sweep through :func:`coupled_qk.training.loop.train` and summarise.

    A run whose ``results.json`` exists is reused, not retrained. With ``max_minutes``, each run is given the
    remaining time as its ``max_minutes``; a run cut short by it is marked ``interrupted`` (its results file is
    renamed ``results.interrupted.json`` and its checkpoint kept, so the next invocation resumes it), and runs
    not started in time are marked ``skipped``. Interrupted and skipped runs are excluded from the best-over-lr
    table. Writes ``results.json`` (every run with its config), ``summary.json`` (compact) and
    ``mqar-<preset>.png`` into ``out_dir``.

    Args:
        preset: the sweep (see :data:`SWEEP_PRESETS`); variants, d_models, lrs and difficulties override its
            values (see :func:`plan_runs`).
        out_dir: sweep folder; data are cached in ``<out_dir>/data-cache``.
        device: ``auto``, ``cpu`` or ``cuda``.
        max_minutes: wall-clock guard for the whole sweep (``None``: no guard).
        log: receives one line per finished run (and a few status lines).
        train_fn: the training function (default :func:`coupled_qk.training.loop.train`; tests may wrap it).

    Returns:
        The summary dict written to ``results.json`` (see :func:`summarize`).

    Raises:
        ValueError: from :func:`plan_runs` or a run's configuration; ``max_minutes`` <= 0.
    """
    if max_minutes is not None and not max_minutes > 0:
        raise ValueError(f"max_minutes={max_minutes!r} must be > 0")
    if train_fn is None:
        from coupled_qk.training.loop import train as train_fn
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cache_dir = out_dir / "data-cache"
    plan = plan_runs(preset, variants, d_models, lrs, difficulties)
    t0 = time.perf_counter()
    deadline = None if max_minutes is None else t0 + 60 * max_minutes
    records = []
    for i, run in enumerate(plan, 1):
        cfg = run_config(preset, run.difficulty, run.variant, run.d_model, run.lr, out_dir, device, cache_dir)
        run_dir = Path(cfg.out_dir)
        tag = f"[{i}/{len(plan)}] {run.difficulty.name:>8s} {run.variant:<20s} d={run.d_model:<4d} lr={run.lr:<8.3g}"
        results_path = run_dir / "results.json"
        if results_path.is_file():
            results = json.loads(results_path.read_text())
            _check_reusable(results.get("config", {}), cfg, run_dir)
            records.append(_record(run, cfg, results, "reused", None))
            log(f"{tag} acc={results['final']['valid/accuracy']:.3f} steps={results['steps']} (reused)")
            continue
        remaining = None if deadline is None else (deadline - time.perf_counter()) / 60
        if remaining is not None and remaining * 60 < 1.0:  # less than a second left
            records.append(_record(run, cfg, {}, "skipped", 0.0))
            log(f"{tag} skipped (--max-minutes {max_minutes} reached)")
            continue
        if remaining is not None:  # the loop counts training time over all sessions of a resumed run
            cfg.max_minutes = remaining + _previous_train_seconds(run_dir) / 60
        if run_dir.is_dir() and not (run_dir / "latest").is_file():
            shutil.rmtree(run_dir)  # a run killed before its first checkpoint: start it again cleanly
        start = time.perf_counter()
        results = train_fn(cfg)
        seconds = time.perf_counter() - start
        status = "ran"
        if results.get("stop_reason") == "max_minutes":
            status = "interrupted"
            if results_path.is_file():
                results_path.replace(run_dir / "results.interrupted.json")
        records.append(_record(run, cfg, results, status, seconds))
        log(f"{tag} acc={results['final']['valid/accuracy']:.3f} steps={results['steps']}/{cfg.max_steps} "
            f"{results['stop_reason']} {seconds:.1f}s" + (" (interrupted)" if status == "interrupted" else ""))
    wall = time.perf_counter() - t0
    summary = summarize(preset, records, wall_seconds=wall)
    (out_dir / "results.json").write_text(json.dumps(summary, indent=2))
    compact = {k: v for k, v in summary.items() if k != "runs"}
    compact["runs"] = [{k: v for k, v in r.items() if k not in ("config", "run_dir")} for r in records]
    (out_dir / "summary.json").write_text(json.dumps(compact, indent=2))
    try:
        plot_results(summary, out_dir / f"mqar-{preset.name}.png")
    except ImportError as exc:  # matplotlib is a dependency, but keep the results if it is missing
        log(f"plot skipped: {exc}")
    return summary


_RUNTIME_FIELDS = ("out_dir", "max_minutes", "device", "resume", "progress", "tensorboard")


def _check_reusable(saved: dict, cfg: TrainConfig, run_dir: Path) -> None:
    """Raise ``ValueError`` if a finished run's saved config differs from the planned one (runtime fields aside)."""
    planned = cfg.to_dict()

    def options(d: dict) -> dict:  # where the data cache lives does not change the run
        return {k: v for k, v in (d.get("task_options") or {}).items() if k != "cache_dir"}

    diff = sorted(k for k in set(saved) | set(planned)
                  if k not in _RUNTIME_FIELDS and k != "task_options" and saved.get(k) != planned.get(k))
    if options(saved) != options(planned):
        diff.append("task_options")
    if diff:
        raise ValueError(
            f"{run_dir}/results.json was trained with a different configuration (fields {diff}); delete that run "
            "folder or choose another --out-dir"
        )


def _previous_train_seconds(run_dir: Path) -> float:
    """Training seconds already spent by a run with a checkpoint (``0.0`` without one)."""
    latest = run_dir / "latest"
    if not latest.is_file():
        return 0.0
    state = run_dir / latest.read_text().strip() / "state.json"
    try:
        return float(json.loads(state.read_text()).get("train_seconds", 0.0))
    except (OSError, ValueError):
        return 0.0


def best_over_lr(records: Sequence[dict]) -> list[dict]:
    """Best final accuracy over learning rates for each (difficulty, variant, d_model).

    Args:
        records: run records with keys ``difficulty, variant, d_model, lr, accuracy, status`` (others are
            carried along from the best run). Records with status ``skipped`` or ``interrupted`` or without an
            accuracy are ignored; ties go to the earliest record.

    Returns:
        One dict per group, in first-seen order: ``difficulty, variant, d_model, accuracy, lr`` (the best),
        ``accuracies`` (``{lr: accuracy}`` over all finished learning rates), ``steps``, ``slices``,
        ``n_heads``, ``params``.
    """
    groups: dict[tuple, dict] = {}
    for r in records:
        if r.get("status") in ("skipped", "interrupted") or r.get("accuracy") is None:
            continue
        key = (r["difficulty"], r["variant"], r["d_model"])
        g = groups.get(key)
        if g is None:
            g = groups[key] = {"difficulty": key[0], "variant": key[1], "d_model": key[2], "accuracy": -1.0,
                               "accuracies": {}}
        g["accuracies"][f"{r['lr']:.3g}"] = r["accuracy"]
        if r["accuracy"] > g["accuracy"]:
            g.update(accuracy=r["accuracy"], lr=r["lr"], steps=r.get("steps"), slices=r.get("slices", {}),
                     n_heads=r.get("n_heads"), params=r.get("params"))
    return list(groups.values())


def summarize(preset: SweepPreset, records: Sequence[dict], wall_seconds: float | None = None) -> dict:
    """The sweep's results: preset, every run, the best-over-lr table and its text rendering.

    Returns:
        ``{"preset", "source", "wall_seconds", "runs", "best", "table", "counts"}`` where ``counts`` counts runs
        by status (``ran``, ``reused``, ``interrupted``, ``skipped``).
    """
    best = best_over_lr(records)
    counts: dict[str, int] = {}
    for r in records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return {
        "preset": preset.to_dict(),
        "source": "Zoology arXiv:2312.04927 protocol (PAPER.md section 6); coupled_qk mqar sweep",
        "wall_seconds": wall_seconds,
        "counts": counts,
        "runs": list(records),
        "best": best,
        "table": format_table(best, [d.name for d in preset.difficulties]),
    }


def format_table(best: Sequence[dict], difficulty_order: Sequence[str] | None = None) -> str:
    """Text table of best-over-lr accuracy: one row per variant, one column per (difficulty, d_model).

    Args:
        best: output of :func:`best_over_lr`.
        difficulty_order: column order of difficulties (default: first-seen order).

    Returns:
        A Markdown table (``-`` where a cell has no finished run); variants in :data:`MQAR_VARIANTS` order.
    """
    diffs = list(difficulty_order or [])
    for b in best:
        if b["difficulty"] not in diffs:
            diffs.append(b["difficulty"])
    present = {b["difficulty"] for b in best}
    diffs = [d for d in diffs if d in present]
    columns = [(d, m) for d in diffs for m in sorted({b["d_model"] for b in best if b["difficulty"] == d})]
    variants = _in_variant_order(b["variant"] for b in best)
    cell = {(b["variant"], b["difficulty"], b["d_model"]): b["accuracy"] for b in best}
    header = "| variant | " + " | ".join(f"{d} d{m}" for d, m in columns) + " |"
    lines = [header, "|" + "---|" * (len(columns) + 1)]
    for v in variants:
        vals = [cell.get((v, d, m)) for d, m in columns]
        lines.append(f"| {v} | " + " | ".join("-" if x is None else f"{x:.3f}" for x in vals) + " |")
    return "\n".join(lines)


def plot_results(summary: dict, path: str | Path) -> Path:
    """Accuracy (best over learning rates) vs d_model, one panel per difficulty, one line per variant (PNG).

    Uses matplotlib's Agg backend (no display needed). Returns the written path.

    Raises:
        ImportError: if matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    best = summary["best"]
    diffs = []
    for b in best:
        if b["difficulty"] not in diffs:
            diffs.append(b["difficulty"])
    order = [d["name"] for d in summary["preset"]["difficulties"]]
    diffs.sort(key=lambda d: order.index(d) if d in order else len(order))
    labels = {d["name"]: Difficulty(**{**d, "train_slices": d["train_slices"], "test_slices": d["test_slices"]}).label
              for d in summary["preset"]["difficulties"]}
    n = max(1, len(diffs))
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.6), sharey=True, squeeze=False)
    variants = _in_variant_order({b["variant"] for b in best})
    for ax, diff in zip(axes[0], diffs):
        for v in variants:
            pts = sorted((b["d_model"], b["accuracy"]) for b in best if b["difficulty"] == diff and b["variant"] == v)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=v)
        ax.set_xscale("log", base=2)
        widths = sorted({b["d_model"] for b in best if b["difficulty"] == diff})
        ax.set_xticks(widths, [str(w) for w in widths])
        ax.minorticks_off()
        ax.set_title(labels.get(diff, diff), fontsize=10)
        ax.set_xlabel("d_model")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("MQAR accuracy (best lr)")
    fig.suptitle(f"MQAR sweep '{summary['preset']['name']}' (best accuracy over learning rates)", fontsize=11)
    if variants:
        handles, names = axes[0][0].get_legend_handles_labels()
        for ax in axes[0][1:]:
            for h, name in zip(*ax.get_legend_handles_labels()):
                if name not in names:
                    handles.append(h)
                    names.append(name)
        fig.legend(handles, names, loc="center right", fontsize=8)
        fig.tight_layout(rect=(0, 0, 0.84, 1))
    else:
        fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

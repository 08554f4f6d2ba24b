"""MQAR sweep presets: the Zoology and Based protocols and a CPU-sized sweep (data, models, optimiser, budget).

Source: Arora, Eyuboglu et al., "Zoology", arXiv:2312.04927 (HazyResearch/zoology, tag ``iclr24``,
``zoology/experiments/iclr24_zoology_figure2/configs.py``); ``docs/METHOD.md`` section 6 and claim C12.

Models: attention-only blocks (``use_mlp=False``), 2 layers, 1 head, learned absolute positions, a sweep of
``d_model``; every attention variant of the library (:func:`mqar_variants`). Differential variants pair
heads into sub-heads, so a sweep with an odd head count gives them twice the heads (one differential head =
two sub-heads of width ``d_model / 2``, parameter-matched to one standard head).

Protocol: AdamW (weight decay 0.1 on matrices), cosine decay to 0 without warmup (Zoology's
``CosineAnnealingLR(eta_min=0)``), early stop when the test accuracy reaches 0.99, a sweep of learning
rates of which the best final accuracy is reported, accuracy = argmax-correct over the query positions,
also per (L, K) slice. Every run goes through the project's one training loop
(:func:`coupled_qk.training.loop.train`) with :class:`coupled_qk.training.tasks.mqar.MQARTask`.

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
from dataclasses import dataclass, field

from coupled_qk.checks.values import positive_int, seed_int
from coupled_qk.models.registry import VARIANTS, default_variants
from coupled_qk.models.specs import variant_attention
from coupled_qk.training.tasks.mqar import parse_slices

__all__ = ["SWEEP_PRESETS", "Difficulty", "SweepPreset", "customize_preset", "get_preset", "heads_for", "mqar_variants"]


def mqar_variants() -> dict[str, dict]:
    """Default sweep variants -> ``GPTConfig`` overrides, computed now from the registry
    (:func:`~coupled_qk.models.registry.default_variants`): the paper's variants and baselines (every built-in
    attention except the ``uncoupled_mlp_differential`` grid cell) plus coupled with the leapfrog integrator
    (``coupled`` is the paper's Euler integrator), and every variant registered later that joined the defaults.
    Any spec of :mod:`coupled_qk.models.specs` works."""
    return {name: VARIANTS[name] for name in default_variants()}


def __getattr__(name: str):
    """``MQAR_VARIANTS``: :func:`mqar_variants` when read (kept for code written before it was a function)."""
    if name == "MQAR_VARIANTS":
        return mqar_variants()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class Difficulty:
    """One (L, K) setting of a sweep: its training and test slices and batch size.

    Attributes:
        name: short label used in tables, plots and folder names (e.g. ``"easy"`` or ``"L64_K4"``).
        train_slices: ``((L, K, N), ...)`` training slices (batches never mix slices).
        test_slices: ``((L, K, N), ...)`` test slices (accuracy is reported overall and per slice).
        batch_size: sequences per optimiser step.

    Raises:
        ValueError: malformed slices (see :func:`coupled_qk.training.tasks.mqar.parse_slices`) or
            ``batch_size`` < 1.
    """

    name: str
    train_slices: tuple
    test_slices: tuple
    batch_size: int

    def __post_init__(self):
        object.__setattr__(self, "train_slices", tuple(parse_slices(self.train_slices, f"{self.name}.train_slices")))
        object.__setattr__(self, "test_slices", tuple(parse_slices(self.test_slices, f"{self.name}.test_slices")))
        positive_int(f"Difficulty {self.name!r}: batch_size", self.batch_size)

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
        variants: variant specs; ``None`` (the default): :func:`mqar_variants` when the sweep is planned.
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
    variants: tuple | None = None
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
        raise ValueError(
            f"difficulty {name!r} is not in preset {self.name!r}; expected one of {[d.name for d in self.difficulties]}"
        )


def _logspace(lo: float, hi: float, n: int) -> tuple:
    return tuple(
        float(f"{10 ** (math.log10(lo) + i * (math.log10(hi) - math.log10(lo)) / (n - 1)):.3g}") for i in range(n)
    )


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
        notes=(
            "Zoology's MHA uses attention dropout 0.1; GPTConfig.dropout would also drop embeddings and "
            "residual branches, so we train without dropout.",
            "Differential variants use n_heads=2 (one differential head of two sub-heads, parameter-matched "
            "to one standard head).",
        ),
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
                (
                    (64, 4, 1_000),
                    (64, 8, 1_000),
                    (64, 16, 1_000),
                    (128, 32, 1_000),
                    (256, 64, 1_000),
                    (512, 128, 1_000),
                    (1024, 256, 1_000),
                ),
                256,
            ),
        ),
        d_models=(64, 128),
        lrs=_logspace(1e-3, 10**-1.5, 4),
        epochs=32.0,
        eval_batch_size=32,
        position="rope",
        notes=(
            "Our choice: RoPE instead of learned positions; learned embeddings beyond the longest training "
            "length (256) would stay untrained at test lengths 512 and 1024. Based's own models use no "
            "position embeddings (a short convolution provides local position).",
            "Test batch 32 as in Zoology (logits of 1024-token sequences over V=8192 are large).",
        ),
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
        notes=(
            "Differential variants use n_heads=2 (one differential head of two sub-heads, parameter-matched "
            "to one standard head).",
            "Budget-bound: 600 steps x 64 sequences; on 2 shared CPU cores the 72 runs take about 15 minutes. "
            "Pilots: 2-layer attention sits on the 1/K plateau (it picks one of the K values in context) and "
            "escapes abruptly (induction-style) after 300-800 steps at d_model 64 and lr ~3e-3, not at all at "
            "lr 1e-2 or d_model 32 within 800 steps; the step of the escape varies with data order and seed.",
            "One seed per cell: differences between variants are within run-to-run variation unless large.",
        ),
    ),
}


def get_preset(name: str) -> SweepPreset:
    """The preset called ``name``; ``ValueError`` listing the valid names otherwise."""
    if name not in SWEEP_PRESETS:
        raise ValueError(f"unknown MQAR sweep preset {name!r}; expected one of {sorted(SWEEP_PRESETS)}")
    return SWEEP_PRESETS[name]


def customize_preset(
    preset: SweepPreset,
    max_steps: int | None = None,
    seed: int | None = None,
    train_examples: int | None = None,
    test_examples: int | None = None,
    batch_size: int | None = None,
) -> SweepPreset:
    """``preset`` with a smaller (or larger) budget, e.g. a one-minute smoke run of any preset.

    Args:
        preset: the preset to change (``None`` arguments keep its values).
        max_steps: the step cap of every run (replaces ``preset.max_steps``; the epoch budget still applies).
        seed: model initialisation and batch-order seed (the data, ``preset.data_seed``, are unchanged).
        train_examples, test_examples: sequences per training / test slice of every difficulty (the slices'
            sequence lengths and key-value pair counts are kept).
        batch_size: sequences per optimiser step of every difficulty (replaces each ``Difficulty.batch_size``;
            the epoch budget in steps follows it).

    Returns:
        A new :class:`SweepPreset` of the same name whose ``notes`` end with a line naming the changes (the
        sweep's ``results.json`` records the preset, so a changed budget is never mistaken for the preset's).

    Raises:
        ValueError: naming the argument, if a count or ``batch_size`` is not an integer >= 1 or ``seed`` is not in
            [0, 2**32 - 1].
    """
    changes: dict = {}
    if max_steps is not None:
        changes["max_steps"] = positive_int("max_steps", max_steps)
    if seed is not None:
        changes["seed"] = seed_int("seed", seed)
    sizes = {"train_slices": train_examples, "test_slices": test_examples}
    for key, n in sizes.items():
        if n is not None:
            positive_int(key.replace("slices", "examples"), n)
    if batch_size is not None:
        positive_int("batch_size", batch_size)
    if any(n is not None for n in sizes.values()) or batch_size is not None:
        changes["difficulties"] = tuple(
            dataclasses.replace(
                d,
                **{
                    key: tuple((L, K, n if n is not None else N) for L, K, N in getattr(d, key))
                    for key, n in sizes.items()
                },
                batch_size=d.batch_size if batch_size is None else batch_size,
            )
            for d in preset.difficulties
        )
    if not changes:
        return preset
    described = {
        **{k: v for k, v in changes.items() if k != "difficulties"},
        **{k.replace("slices", "examples"): v for k, v in sizes.items() if v is not None},
        **({"batch_size": batch_size} if batch_size is not None else {}),
    }
    note = "Changed from the preset: " + ", ".join(f"{k}={v}" for k, v in described.items()) + "."
    return dataclasses.replace(preset, notes=(*preset.notes, note), **changes)


def heads_for(variant: str, n_heads: int) -> int:
    """Heads for ``variant``: ``2 * n_heads`` for differential variants when ``n_heads`` is odd, else ``n_heads``.

    A differential head is a pair of sub-heads of width ``d_model / n_heads``; doubling an odd head count keeps
    the parameter count of the attention projections equal to the standard model's.
    """
    group = variant_attention(variant).head_group
    return group * n_heads if n_heads % group else n_heads

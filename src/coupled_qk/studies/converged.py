"""The tuned studies (named "converged"): every model at its own tuned learning rate, trained to the end of a
schedule whose horizon the plateau rule set, from paired initial weights, evaluated from its best-validation
checkpoint (:mod:`coupled_qk.study.grid`). The runs are annealed, not verified minima
(:mod:`coupled_qk.study.regime` reads how far each still fell at its end). Pre-registered: seeds, grid, plateau rule
and stages are fixed before a study's first run and not changed from the command line.

Stages: ``grid`` (every variant at each learning rate on the reserve seed, extended once at an edge), ``main``
(standard vs coupled: C1, or C9 on PubMed), ``matched`` (standard on ``matched_factor`` x the tokens: C6),
``uncoupled`` (the uncoupled MLP: C3, C4), ``fresh`` (``fresh_variants`` on ``matched_factor`` x the training
documents: C6 with fresh data, and with coupled there too the main claim at that data). A design with
``smaller`` adds the main claim's size interaction (this design's change minus the smaller design's, Welch's
interval: the sizes share no runs). The pre-registration, the data and the cost measured for each study are in
``docs/results/STUDIES.md``.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from coupled_qk.study.claims import Arm, ChangeDifference, Claim, Equivalence, PairedChange, VarianceRatio
from coupled_qk.study.design import Study
from coupled_qk.study.grid import EpochBudget, LrGrid, Tuned
from coupled_qk.study.stage_report import FreshNote, Headline, RegimeCheck, StageReport, TokensRatio

ORDER = 1  # listed after the first-epoch studies (coupled_qk.studies.studies)
EQUIVALENCE_MARGIN = 1.0  # percent, as the first-epoch claims
PAPER_C4 = 8.0  # the paper's seed-variance ratio, uncoupled MLP / coupled: C4's power refers to it
PAPER = {"C1": -6.6, "C3": 100 * (22.585 / 23.81 - 1), "C9": -4.5}
PAPER_SETTING = (("C1", "at 60M parameters on WikiText-103"), ("C9", "on PubMed (its 60M model)"))
"""Where the paper measured the claim a study's main stage tests."""


@dataclasses.dataclass(frozen=True)
class Design:
    """One converged study's parameters (see the module docstring; :class:`~coupled_qk.study.grid.EpochBudget`
    for ``base``, ``split``, ``train_tokens``, ``epochs``, ``long_epochs``, ``evals_per_epoch``).

    Attributes:
        lrs, reserve_seed: the grid; seeds, matched_seeds, fresh_seeds: the stages' seeds (empty: no such stage);
        matched_factor: the compute-matched and fresh-data multiple; fresh_variants: the fresh stage's variants;
        variants: standard, coupled and (optionally) the uncoupled MLP, in that role order;
        main_claim: C1, or C9 on PubMed; beside: a first-epoch study shown beside (its report in the same folder);
        model: the model in words for the README's sentence; needs_gpu: runs only where a GPU is;
        tokens_per_second: expected throughput per run (cost estimate); smaller: a design of the same claims at a
        smaller model, for the size interaction.
    """

    name: str
    description: str
    budget: EpochBudget
    lrs: tuple[float, ...]
    reserve_seed: int
    seeds: tuple[int, ...]
    matched_seeds: tuple[int, ...]
    matched_factor: float = 2.4
    fresh_seeds: tuple[int, ...] = ()
    fresh_variants: tuple[str, ...] = ("standard",)
    variants: tuple[str, ...] = ("standard", "coupled", "uncoupled_mlp")
    main_claim: str = "C1"
    beside: str | None = None
    model: str = "tiny preset"
    needs_gpu: bool = False
    tokens_per_second: float = 2800.0
    smaller: str | None = None
    notes: tuple[str, ...] = ()
    default_out_dir: str = "docs/results/claims"


def stages(d: Design) -> tuple:
    """The grid and the stages it tunes."""
    standard, coupled = d.variants[:2]
    out = [
        LrGrid(d.budget, d.variants, d.lrs, d.reserve_seed),
        Tuned("main", d.budget, (standard, coupled), d.seeds, (d.main_claim,)),
    ]
    if d.matched_seeds:
        out.append(Tuned("matched", d.budget, (standard,), d.matched_seeds, ("C6",), tokens=d.matched_factor))
    if len(d.variants) > 2:
        out.append(Tuned("uncoupled", d.budget, (d.variants[2],), d.seeds, ("C3", "C4")))
    if d.fresh_seeds:
        out.append(Tuned("fresh", d.budget, d.fresh_variants, d.fresh_seeds, ("C6-fresh",), data=d.matched_factor))
    return tuple(out)


def claims(d: Design) -> tuple[Claim, ...]:
    """The main claim, C3 and C4 (with an uncoupled stage), C6 (with a matched stage), C6-fresh (with a fresh one)."""
    standard, coupled = d.variants[:2]
    main, f, m = f"{d.name}-main", d.matched_factor, EQUIVALENCE_MARGIN
    std, cpl = Arm(main, standard), Arm(main, coupled)
    label = "test ppl, coupled vs standard, % (paired by seed: data order and shared initial weights)"
    out = [Claim(d.main_claim, "", "", PairedChange(std, cpl, label), PAPER.get(d.main_claim))]
    if len(d.variants) > 2:
        unc = Arm(f"{d.name}-uncoupled", d.variants[2])
        out.append(
            Claim(
                "C3",
                "",
                "",
                PairedChange(unc, cpl, "test ppl, coupled vs uncoupled MLP, % (paired by seed)"),
                PAPER["C3"],
            )
        )
        ratio = (
            "seed variance of test ppl, uncoupled MLP / coupled (paired, Pitman-Morgan; power for the paper's "
            f"{PAPER_C4:g}x at the observed correlation, detectable ratio at 80%)"
        )
        out.append(Claim("C4", "", "", VarianceRatio(unc, cpl, ratio), PAPER_C4))
    equivalent = f"% (equivalent if the interval is inside +-{m}%)"
    if d.matched_seeds:
        matched = Arm(f"{d.name}-matched", standard)
        test = Equivalence(
            matched,
            f"test ppl, coupled (1x) vs standard ({f}x tokens), {equivalent}",
            m,
            b=cpl,
            reading=f"equivalent (coupled at 1x matches standard at {f}x)",
        )
        out.append(Claim("C6", "", "", test, extras=(TokensRatio(), RegimeCheck(matched, std, f))))
    if d.fresh_seeds:
        fresh = Arm(f"{d.name}-fresh", standard, per_tokens_of=cpl)
        test = Equivalence(
            fresh,
            f"test ppl, coupled (1x) vs standard ({f}x training articles, {f}x tokens; per 1x-tokenizer token), "
            f"{equivalent}",
            m,
            b=cpl,
            reading=f"equivalent (coupled at 1x matches standard with {f}x data)",
        )
        out.append(Claim("C6-fresh", "", "", test, extras=(TokensRatio(), FreshNote(Arm(main, standard), f))))
        if coupled in d.fresh_variants:
            both = f"test ppl, coupled vs standard, both on {f}x the training articles, % (paired by seed)"
            out.append(
                Claim(
                    f"{d.main_claim}-fresh",
                    "",
                    "",
                    PairedChange(Arm(fresh.cell, standard), Arm(fresh.cell, coupled), both),
                )
            )
    if d.smaller:
        small = f"{d.smaller}-main"
        pairs = ((Arm(small, standard, d.smaller), Arm(small, coupled, d.smaller)), (std, cpl))
        label = f"{d.main_claim} here minus {d.main_claim} in {d.smaller}, percentage points (unpaired sizes: Welch)"
        out.append(Claim(f"{d.main_claim}-size", "", "", ChangeDifference(*pairs, label, paired=False)))
    return tuple(out)


def layout(d: Design) -> StageReport:
    """The report: Holm over the direction claims, the mean validation curve of every arm, the first-epoch study
    beside it, the README's sentence."""
    standard, coupled = d.variants[:2]
    main, f = f"{d.name}-main", d.matched_factor
    curves = [(standard, Arm(main, standard)), (coupled, Arm(main, coupled))]
    if len(d.variants) > 2:
        curves.append((d.variants[2], Arm(f"{d.name}-uncoupled", d.variants[2])))
    if d.matched_seeds:
        curves.append((f"{standard} {f}x", Arm(f"{d.name}-matched", standard)))
    if d.fresh_seeds:
        curves.append((f"{standard} {f}x data", Arm(f"{d.name}-fresh", standard, per_tokens_of=Arm(main, coupled))))
    return StageReport(
        holm=(d.main_claim, "C3"),
        curves=tuple(curves),
        beside=d.beside,
        beside_claims=("C1", "C3", "C4", "C6", "C9"),
        paper_ratio=PAPER_C4,
        headline=Headline(d.budget.train_tokens, d.model, PAPER_SETTING, d.beside or "cpu"),
    )


def study(d: Design) -> Study:
    """The :class:`~coupled_qk.study.design.Study` of a design (frozen: pre-registered)."""
    return Study(
        d.name,
        d.description,
        stages(d),
        claims(d),
        layout(d),
        notes=d.notes,
        frozen=True,
        needs_gpu=d.needs_gpu,
        default_out_dir=d.default_out_dir,
        tokens_per_second=d.tokens_per_second,
    )


_TINY_BASE = dict(
    task="lm",
    corpus="wiki-vital-quarter",
    tokenizer="bpe-8192",
    preset="tiny",
    batch_size=16,
    warmup_steps=60,
    min_lr_ratio=0.1,
    eval_batches=4,
    log_interval=16,
    full_eval=True,
    best_metric="valid/loss",
    patience=4,
    checkpoint_minutes=5.0,
)
_WIKI_QUARTER = dict(source="wiki-vital", seed=0, valid_docs=200, test_docs=1000, train_fraction=0.25)

CPU_CONVERGED = Design(
    name="cpu-converged",
    description="tiny preset on a quarter of the wiki-vital articles, per-variant learning rates, annealed to the end "
    "of the horizon the plateau rule set, best-validation checkpoints, 1,000-article test split",
    budget=EpochBudget(_TINY_BASE, _WIKI_QUARTER, 270_841, 8.0, 12.0, 4),  # bpe-8192 tokens of the training split
    lrs=(1e-3, 2e-3, 4e-3),
    reserve_seed=100,
    seeds=tuple(range(10)),
    matched_seeds=(0, 1, 2, 3),
    fresh_seeds=(0, 1, 2, 3),
    fresh_variants=("standard", "coupled"),
    beside="cpu",
)

CPU_CONVERGED_PUBMED = dataclasses.replace(
    CPU_CONVERGED,
    name="cpu-converged-pubmed",
    description="the cpu-converged design on a quarter of the PubMed abstracts (C9: standard vs coupled only), "
    "600-abstract test split",
    budget=EpochBudget(
        {**_TINY_BASE, "corpus": "pubmed-quarter"},
        dict(source="pubmed", seed=0, valid_docs=100, test_docs=600, train_fraction=0.25),
        374_345,  # bpe-8192 tokens of the training split
        8.0,
        12.0,
        4,
    ),
    variants=("standard", "coupled"),
    main_claim="C9",
    matched_seeds=(),
    fresh_seeds=(),
    tokens_per_second=3500.0,
)

CPU_CONVERGED_SMALL = dataclasses.replace(
    CPU_CONVERGED,
    name="cpu-converged-small",
    description="the cpu-converged design with a ~3.7x larger model (6 layers x 256, 8 heads, 6.8M parameters): "
    "the size axis of C1, standard vs coupled",
    budget=dataclasses.replace(
        CPU_CONVERGED.budget, base={**_TINY_BASE, "model": {"n_layer": 6, "d_model": 256, "n_heads": 8}}
    ),
    variants=("standard", "coupled"),
    matched_seeds=(),
    fresh_seeds=(),
    fresh_variants=(),
    model="6 layers x 256, 6.8M parameters",
    tokens_per_second=1000.0,
    smaller="cpu-converged",
    beside=None,  # the first-epoch C1 is the tiny model's: not this size
)

TOY_CONVERGED = dataclasses.replace(
    CPU_CONVERGED,
    name="toy-converged",
    description="the cpu-converged design at toy size (every code path; numbers meaningless), for CI",
    budget=EpochBudget(
        {
            **_TINY_BASE,
            "corpus": "wiki-vital-toy",
            "tokenizer": "bpe-300",
            "batch_size": 4,
            "warmup_steps": 2,
            "eval_batches": 2,
            "log_interval": 1,
            "patience": 2,
            "checkpoint_minutes": None,
            "model": {"n_layer": 1, "d_model": 16, "n_heads": 2, "block_size": 32},
        },
        dict(source="wiki-vital", seed=0, valid_docs=4, test_docs=6, train_fraction=0.003),
        1_024,
        2.0,
        3.0,
        2,
    ),
    lrs=(1e-3, 3e-2),
    seeds=(0, 1, 2),
    matched_seeds=(0, 1),
    fresh_seeds=(0, 1),
    fresh_variants=("standard",),
    beside=None,
    notes=("Toy budgets: exercises the instrument only.",),
    default_out_dir="runs/claims-toy",
)

WT103_TRAIN_TOKENS = 117_000_000  # GPT-2 tokens of WikiText-103 train (~103M words); an estimate

GPU_60M = Design(
    name="gpu-60m",
    description="60M preset on WikiText-103 (GPT-2 BPE), per-variant learning rates, annealed to the end of the "
    "horizon the plateau rule set, best-validation checkpoints",
    budget=EpochBudget(
        dict(
            task="lm",
            corpus="wikitext-103",
            tokenizer="gpt2",
            preset="60m",
            batch_size=32,
            grad_accum=1,
            warmup_steps=2000,
            min_lr_ratio=0.1,
            eval_batches=50,
            log_interval=50,
            full_eval=True,
            best_metric="valid/loss",
            patience=4,
            dtype="bf16",
            compile=True,
            checkpoint_minutes=15.0,
        ),
        None,
        WT103_TRAIN_TOKENS,
        5.0,
        8.0,
        4,
    ),
    lrs=(3e-4, 6e-4, 1.2e-3),
    reserve_seed=100,
    seeds=(0, 1, 2, 3, 4),
    matched_seeds=(0, 1, 2),
    needs_gpu=True,
    model="60m preset",
    tokens_per_second=250_000.0,
)

TOY_GPU_60M = dataclasses.replace(
    GPU_60M,
    name="toy-gpu-60m",
    description="the gpu-60m design at toy size (WikiText-103 layout, GPT-2 BPE, its grid and stages; fp32, eager), "
    "so that the GPU protocol's code path runs on a CPU in CI; numbers meaningless",
    budget=EpochBudget(
        {
            **GPU_60M.budget.base,
            "preset": "tiny",
            "batch_size": 4,
            "warmup_steps": 2,
            "eval_batches": 2,
            "log_interval": 1,
            "patience": 2,
            "dtype": "fp32",
            "compile": False,
            "checkpoint_minutes": None,
            "model": {"n_layer": 1, "d_model": 16, "n_heads": 2, "block_size": 32},
        },
        None,
        2_048,
        2.0,
        3.0,
        2,
    ),
    lrs=(1e-3, 3e-2),
    seeds=(0, 1, 2),
    matched_seeds=(0, 1),
    needs_gpu=False,
    model="tiny preset",
    tokens_per_second=2_000.0,
    notes=("Toy budgets on a small WikiText-103-layout folder: exercises the GPU protocol's path only.",),
    default_out_dir="runs/claims-toy",
)

DESIGNS = {
    d.name: d for d in (CPU_CONVERGED, CPU_CONVERGED_PUBMED, CPU_CONVERGED_SMALL, TOY_CONVERGED, GPU_60M, TOY_GPU_60M)
}
STUDIES = tuple(study(d) for d in DESIGNS.values())


def train_config_dict(
    d: Design, variant: str, lr: float, seed: int, epochs: float | None = None, out_dir: str | None = None
) -> dict:
    """The :class:`TrainConfig` (as a JSON dict) of one run of ``d``, as a standalone config file would hold it
    (``coupled-qk train --config FILE``): the single source of the committed ``configs/`` files."""
    from coupled_qk.checks.values import finite
    from coupled_qk.study.design import Cell

    epochs = d.budget.epochs if epochs is None else finite("epochs", epochs, 0, lo_open=True)  # 0 is not "default"
    cell = Cell("x", d.budget.cell_base(epochs, lr), (variant,), (seed,), ())
    cfg = cell.config(variant, seed, Path(out_dir or f"runs/{d.name}-{variant}-seed{seed}"), None)
    out = cfg.to_dict()
    out.pop("progress", None)
    out.pop("tensorboard", None)
    return {k: v for k, v in out.items() if not (isinstance(v, float) and math.isnan(v))}


def standalone_configs(d: Design) -> dict[str, dict]:
    """``{file name: config dict}`` of one run per variant of ``d`` at the grid's middle learning rate and seed 0,
    for ``coupled-qk train --config FILE`` outside the study (the committed ``configs/wt103-60m-*.json`` come from
    :data:`GPU_60M` through this function; a test keeps them equal)."""
    lr = sorted(d.lrs)[len(d.lrs) // 2]
    stem = "wt103-60m" if d.name == "gpu-60m" else d.name
    return {f"{stem}-{v}.json": train_config_dict(d, v, lr, 0, out_dir=f"runs/{stem}-{v}") for v in d.variants}


def write_configs(d: Design, folder: str | Path) -> list[Path]:
    """Write :func:`standalone_configs` into ``folder`` (JSON, sorted keys); return the paths."""
    import json

    from coupled_qk.files import write_text_atomic

    out = []
    for name, cfg in standalone_configs(d).items():
        path = Path(folder) / name
        write_text_atomic(path, json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        out.append(path)
    return out

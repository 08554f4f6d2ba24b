"""Named claims protocols: which runs answer which paper claim, at which budget (``docs/METHOD.md`` section 3).

A protocol is an ordered list of :class:`Cell` s. A cell is one base training configuration, a list of
variant specs (:mod:`coupled_qk.variants`) and seeds; every ``(variant, seed)`` of a cell uses the same data
order for a given seed, so differences between variants of one cell (and between cells that differ only in
the variant) are *paired by seed*. Runs are executed cell by cell, seed-major inside a cell (all variants of
seed 0, then seed 1 ...), so an interrupted protocol always leaves complete pairs.

Protocols (budgets are our choice; the paper's token budgets are unknown):

* ``smoke``: every code path with toy budgets (a few steps, two seeds), for tests; its numbers mean nothing.
* ``cpu``: the study these CPUs allow (see :data:`CPU_NOTES` for the throughput measurement behind it).
* ``gpu-paper``: the paper-scale configurations (60M/150M/350M), defined with token budgets and expected
  accelerator hours, not run here.

The studies trained to a plateau (``cpu-converged``, ``gpu-60m``, ``toy-converged``) are *designs* with
stages, in :mod:`coupled_qk.experiments.claims.converged`.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from coupled_qk._checks import choice

# ---- shared budgets ---------------------------------------------------------------------------------------
TOKENS_PER_STEP_TINY = 16 * 128  # batch 16 x context 128
CPU_TOKENS = 512 * TOKENS_PER_STEP_TINY  # 1,048,576 tokens per run at the tiny preset (see CPU_NOTES)

CPU_NOTES = (
    "Budget (our choice): 1,048,576 tokens per tiny-preset run (512 steps of 16 x 128), about 0.86 epoch of the "
    "1.22M-token wiki-vital training articles, chosen so that the whole protocol (150 runs when chosen, the ~4x "
    "model included; 171 with the extra seeds) takes about 16 CPU-hours on an idle machine, where a single-threaded "
    "tiny run trains at about "
    "4k tokens/s (the demo ran 901,120 tokens in 2.2 minutes on 2 cores). Measured in this session on the shared "
    "machine (load average 12-24 from other jobs): 185-340 tokens/s per process, so a 1M-token run took over an "
    "hour; the cpu-short protocol (a quarter of these budgets) is the part that finishes in a session there. "
    "Measured on 2026-11-30 with no other jobs: 2,700-2,900 tokens/s per single-threaded process with two "
    "processes on the 2 cores, about 7 minutes per 1M-token tiny run.",
    "wiki-vital runs train on 96% of the wiki-vital articles and report held-out perplexity on 2% + 2% "
    "unseen articles (in distribution) next to WikiText-2 valid/test perplexity (out of distribution).",
)

_TINY_LM = dict(
    task="lm",
    corpus="wiki-vital-heldout",
    tokenizer="bpe-8192",
    preset="tiny",
    batch_size=16,
    lr=2e-3,
    warmup_steps=50,
    max_tokens=CPU_TOKENS,
    eval_interval=64,
    eval_batches=4,
    log_interval=16,
)
_SMALL = dict(n_layer=6, d_model=256, n_heads=8)  # d_head 32 like tiny; ~3.7x tiny's parameters


@dataclass(frozen=True)
class Cell:
    """One block of runs: ``variants x seeds`` on one base configuration.

    Attributes:
        name: folder-safe identifier (records go to ``runs/<name>/<variant>/seed<k>.json``).
        base: :class:`~coupled_qk.training.config.TrainConfig` fields shared by every run (``lm`` task); for
            ``mqar`` cells ``mqar`` holds the sweep point instead.
        variants: variant specs (``name[+field=value...]``).
        seeds: seeds (each seed fixes initialisation and data order).
        claims: the claim ids this cell feeds.
        heldout: wiki-vital article split + WikiText-2 evaluation (:mod:`coupled_qk.experiments.claims.heldout`).
        mqar: for ``task="mqar"``: ``{"preset": name, "difficulty": name, "d_model": int, "lr": float}``.
        est_cpu_minutes: expected minutes per run on one idle CPU core (0 if not measured).
        seeds_of: the name of a cell this one adds seeds to (same base and variants, other seeds): the claim
            rules read its records as that cell's (e.g. ``wv-tiny-seeds`` brings ``wv-tiny`` to 5 seeds).
        split: keyword arguments of :func:`coupled_qk.experiments.claims.heldout.document_split` (a training subset
            and an enlarged test split, written under the derived-data folder as the corpus ``base["corpus"]``).
        variant_base: per-variant overrides of ``base`` (e.g. ``{"coupled": {"lr": 0.004}}``: hyperparameters
            chosen per variant by a grid stage).
    """

    name: str
    base: dict
    variants: tuple[str, ...]
    seeds: tuple[int, ...]
    claims: tuple[str, ...]
    heldout: bool = False
    mqar: dict | None = None
    est_cpu_minutes: float = 0.0
    seeds_of: str | None = None
    split: dict | None = None
    variant_base: dict = field(default_factory=dict)

    def __post_init__(self):
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.name):
            raise ValueError(f"Cell.name={self.name!r} must be folder-safe ([A-Za-z0-9_.-]+)")
        if not self.variants or not self.seeds:
            raise ValueError(f"Cell {self.name!r} needs at least one variant and one seed")

    def units(self) -> list[tuple[str, int]]:
        """``(variant, seed)`` pairs in execution order: seed-major, so interruptions leave complete pairs."""
        return [(v, s) for s in self.seeds for v in self.variants]


@dataclass(frozen=True)
class Protocol:
    """A named, ordered list of cells plus what a reader needs to judge it."""

    name: str
    description: str
    cells: tuple[Cell, ...]
    notes: tuple[str, ...] = ()
    runnable: bool = True
    expected_hours: dict = field(default_factory=dict)
    extra_variants: tuple[str, ...] = ()  # added by with_variants (claims --variants)

    def cell(self, name: str) -> Cell:
        """The cell called ``name`` (``KeyError`` if absent)."""
        for c in self.cells:
            if c.name == name:
                return c
        raise KeyError(name)

    def has_cell(self, name: str) -> bool:
        """Whether the protocol defines a cell called ``name``."""
        return any(c.name == name for c in self.cells)

    def with_variants(self, specs) -> Protocol:
        """The same protocol with the variant specs ``specs`` (``claims --variants``; any registered variant,
        plugins included, optionally ``+field=value``) trained in every cell next to the cell's own variants,
        paired by seed; the report compares each with the cell's ``standard`` runs. Specs a cell already has are
        not repeated.

        Raises:
            ValueError: an unknown variant or an invalid spec (from :func:`~coupled_qk.models.specs.parse_variants`),
                or a spec of the same model as another one or as one of a cell's own variants under another
                name (``coupled+n_steps=1`` next to ``coupled``: :func:`~coupled_qk.models.specs.check_distinct`).
        """
        from coupled_qk.models.specs import check_distinct, parse_variants

        extra = tuple(parse_variants(list(specs)))
        cells = tuple(
            dataclasses.replace(c, variants=c.variants + tuple(v for v in extra if v not in c.variants))
            for c in self.cells
        )
        for c in cells:
            check_distinct(c.variants, where=f"--variants (cell {c.name})")
        return dataclasses.replace(self, cells=cells, extra_variants=self.extra_variants + extra)

    def with_seeds(self, seeds: tuple[int, ...]) -> Protocol:
        """The same protocol with every cell's seeds replaced (``--seeds``)."""
        return dataclasses.replace(self, cells=tuple(dataclasses.replace(c, seeds=tuple(seeds)) for c in self.cells))


def _lm(name: str, variants, seeds, claims, minutes: float, heldout: bool = True, **overrides) -> Cell:
    model = {**_TINY_LM.get("model", {}), **overrides.pop("model", {})}
    base = {**_TINY_LM, **overrides, "model": model}
    return Cell(name, base, tuple(variants), tuple(seeds), tuple(claims), heldout=heldout, est_cpu_minutes=minutes)


def _mqar(difficulty: str, lr: float, seeds, preset: str = "cpu", d_model: int = 64, minutes: float = 1.0) -> Cell:
    """An MQAR cell: the ``cpu`` MQAR sweep's point (V 64, L 16, K 2/3/4, 2 attention-only layers) with a longer
    horizon (1,000 steps instead of 600: the first sweep's escapes from the 1/K plateau came after 300-800)."""
    tag = f"{lr:.0e}".replace("e-0", "e-")
    spec = {"preset": preset, "difficulty": difficulty, "d_model": d_model, "lr": lr, "max_steps": 1000}
    return Cell(
        f"mqar-{difficulty}-lr{tag}",
        {},
        ("standard", "coupled"),
        tuple(seeds),
        ("C12",),
        mqar=spec,
        est_cpu_minutes=minutes,
    )


S3, S5 = (0, 1, 2), (0, 1, 2, 3, 4)
_TINY_MIN = 5.0  # minutes per tiny run at ~4k tokens/s on one idle core, including evaluation

CPU_CELLS = (
    # C1/C3/C4 (+ C5 n=1, C6 1x, C13): the cell everything else is paired with
    _lm("wv-tiny", ("standard", "coupled", "uncoupled_mlp"), S3, ("C1", "C3", "C4", "C13"), _TINY_MIN),
    _lm("wv-tiny-leapfrog", ("coupled_leapfrog",), S3, ("C2",), _TINY_MIN),
    dataclasses.replace(
        _lm("wv-tiny-seeds", ("standard", "coupled", "uncoupled_mlp"), (3, 4), ("C1", "C3", "C4"), _TINY_MIN),
        seeds_of="wv-tiny",
    ),
    _lm("wv-tiny-steps", ("coupled+n_steps=2", "coupled+n_steps=4", "coupled+n_steps=7"), S3, ("C5",), 8.0),
    _lm("wv-tiny-2x", ("standard", "coupled"), S3, ("C6", "scan"), 2 * _TINY_MIN, max_tokens=2 * CPU_TOKENS),
    _lm("wv-tiny-diff", ("differential", "coupled_differential"), S3, ("C8",), 6.0),
    _lm("wv-small", ("standard", "coupled", "differential"), S3, ("C7", "C8"), 4 * _TINY_MIN, model=_SMALL),
    _lm("pubmed-tiny", ("standard", "coupled"), S3, ("C9",), _TINY_MIN, heldout=False, corpus="pubmed"),
    _lm("mixed-tiny", ("standard", "coupled"), S3, ("C10",), _TINY_MIN, heldout=False, corpus="mixed-domain"),
    *(_mqar(d, lr, S3) for d in ("easy", "medium", "hard") for lr in (5e-4, 1e-3, 2e-3, 3e-3)),
    # the smallest setting where coupling helps (issue item 4): one factor at a time against wv-tiny
    _lm("scan-dhead64", ("standard", "coupled"), S3, ("scan",), _TINY_MIN, model={"n_heads": 2}),
    _lm("scan-dt0.5", ("coupled+dt_init=0.5",), S3, ("scan",), _TINY_MIN),
    _lm("scan-hidden128", ("coupled+dynamics_hidden=128",), S3, ("scan",), _TINY_MIN),
    _lm("scan-bpe4096", ("standard", "coupled"), S3, ("scan",), _TINY_MIN, tokenizer="bpe-4096"),
    # beyond the paper (issue 12): grouped-query attention with per-head evolved keys (the paper's rule, a
    # KV cache n_heads / n_kv_heads times standard's) vs one shared evolved key per key/value head
    _lm(
        "gqa-tiny",
        ("standard", "coupled", "coupled+keys_per_query_head=False"),
        S3,
        ("gqa",),
        _TINY_MIN,
        model={"n_kv_heads": 2},
    ),
)

CPU_EXTRA_SEEDS = (
    # seeds 3-4 where the 3-seed effects were small against their spread (issue item 2: 5 seeds there); cpu only
    dataclasses.replace(
        _lm("wv-small-seeds", ("standard", "coupled"), (3, 4), ("C7",), 4 * _TINY_MIN, model=_SMALL),
        seeds_of="wv-small",
    ),
    dataclasses.replace(
        _lm("pubmed-tiny-seeds", ("standard", "coupled"), (3, 4), ("C9",), _TINY_MIN, heldout=False, corpus="pubmed"),
        seeds_of="pubmed-tiny",
    ),
    dataclasses.replace(
        _lm(
            "mixed-tiny-seeds",
            ("standard", "coupled"),
            (3, 4),
            ("C10",),
            _TINY_MIN,
            heldout=False,
            corpus="mixed-domain",
        ),
        seeds_of="mixed-tiny",
    ),
)
"""Cells of the ``cpu`` protocol only (``cpu-short`` has the other cells at a quarter of the budget)."""

SCAN_FACTORS = (
    # (label, cell of the coupled run, coupled variant, cell of the standard run)
    ("baseline (the wv-tiny cell: d_head 32, dt_init 0.1, hidden 32, bpe-8192)", "wv-tiny", "coupled", "wv-tiny"),
    ("d_head 64 (2 heads)", "scan-dhead64", "coupled", "scan-dhead64"),
    ("dt_init 0.5", "scan-dt0.5", "coupled+dt_init=0.5", "wv-tiny"),
    ("force hidden 128", "scan-hidden128", "coupled+dynamics_hidden=128", "wv-tiny"),
    ("2x tokens", "wv-tiny-2x", "coupled", "wv-tiny-2x"),
    ("bpe-4096 vocabulary", "scan-bpe4096", "coupled", "scan-bpe4096"),
)
"""The scan of issue item 4: each factor changes one setting of the wv-tiny cell."""


SMOKE_KEEP = {
    # cell -> variants kept in the smoke protocol (None: all): the fewest runs that exercise every claim rule
    "wv-tiny": None,
    "wv-tiny-leapfrog": None,
    "wv-tiny-steps": ("coupled+n_steps=2",),
    "wv-tiny-2x": ("standard",),
    "wv-small": None,
    "pubmed-tiny": None,
    "mixed-tiny": None,
    "scan-dt0.5": None,
    "mqar-easy-lr1e-3": None,
    "mqar-medium-lr1e-3": None,
    "gqa-tiny": None,
}


def _smoke_cells() -> tuple[Cell, ...]:
    toy = dict(
        model={"n_layer": 1, "d_model": 32, "n_heads": 2, "block_size": 32},
        tokenizer="bpe-512",
        batch_size=4,
        max_tokens=None,
        max_steps=6,
        warmup_steps=2,
        eval_interval=3,
        eval_batches=2,
        log_interval=1,
    )
    out = []
    for c in CPU_CELLS:
        if c.name not in SMOKE_KEEP:
            continue
        variants = SMOKE_KEEP[c.name] or c.variants
        if c.mqar is not None:
            out.append(
                dataclasses.replace(
                    c, variants=variants, seeds=(0, 1), mqar={**c.mqar, "max_steps": 4}, est_cpu_minutes=0.05
                )
            )
            continue
        base = {**c.base, **toy, "max_steps": 12 if c.name == "wv-tiny-2x" else 6}
        if "n_kv_heads" in c.base.get("model", {}):  # keep grouped-query attention: 2 query heads, 1 kv head
            base["model"] = {**toy["model"], "n_kv_heads": 1}
        out.append(dataclasses.replace(c, base=base, variants=variants, seeds=(0, 1), est_cpu_minutes=0.05))
    return tuple(out)


def _gpu(name: str, presets: dict, hours: dict, description: str) -> Protocol:
    cells = []
    for preset, tokens in presets.items():
        base = dict(
            task="lm",
            corpus="wikitext-103",
            tokenizer="gpt2",
            preset=preset,
            batch_size=32,
            grad_accum=1,
            lr=6e-4,
            warmup_steps=2000,
            max_tokens=tokens,
            eval_interval=1000,
            eval_batches=50,
            log_interval=50,
            dtype="bf16",
        )
        variants = ("standard", "coupled", "coupled_leapfrog", "uncoupled_mlp", "differential")
        cells.append(Cell(f"wt103-{preset}", base, variants, S3, ("C1", "C2", "C3", "C4", "C7", "C8", "C13")))
    return Protocol(
        name,
        description,
        tuple(cells),
        runnable=False,
        expected_hours=hours,
        notes=(
            "Not run in this project: defined so that a user with accelerators runs the same instrument. "
            "Token budgets are our choice (the paper's are unknown); hours are estimates, not measurements: "
            "6 x parameters x tokens FLOPs in bf16 on one H100/H200 at about 40% utilisation (~400 TFLOP/s).",
        ),
    )


def _scaled(cells: tuple[Cell, ...], factor: float, eval_interval: int, warmup_steps: int) -> tuple[Cell, ...]:
    """``cells`` with every language-model budget multiplied by ``factor`` (MQAR cells unchanged)."""
    out = []
    for c in cells:
        if c.mqar is None:
            base = {
                **c.base,
                "max_tokens": int(c.base["max_tokens"] * factor),
                "eval_interval": eval_interval,
                "warmup_steps": warmup_steps,
            }
            c = dataclasses.replace(c, base=base, est_cpu_minutes=c.est_cpu_minutes * factor)
        out.append(c)
    return tuple(out)


CPU_SHORT_NOTES = (
    "The part of the study sized for one session on the loaded shared machine: every language-model budget is a "
    "quarter of the cpu protocol's (262,144 tokens = 128 steps of 16 x 128 at the tiny preset, about 0.2 "
    "epoch of the wiki-vital training articles; warmup 12 steps; validation every 16 steps). Measured before "
    "choosing it: 240-340 tokens/s per single-threaded training process with the machine's load average at "
    "12-24 (other jobs), so a 1M-token run took over an hour and the C1/C3/C4 cell (9 runs) could not finish "
    "in the session; at this budget a run took about 25 minutes (about 185 tokens/s over the whole run). At this "
    "budget the models are early in training (perplexities in the hundreds): "
    "verdicts are about early training, not the paper's converged models.",
    CPU_NOTES[1],
)

PROTOCOLS: dict[str, Protocol] = {
    "smoke": Protocol(
        "smoke",
        "every code path with toy budgets (numbers are meaningless)",
        _smoke_cells(),
        notes=("Toy model (1 layer, d_model 32), 6-12 steps, 2 seeds: exercises the instrument.",),
    ),
    "cpu": Protocol(
        "cpu", "tiny-preset study on the offline corpora, 2 CPU cores", CPU_CELLS + CPU_EXTRA_SEEDS, notes=CPU_NOTES
    ),
    "cpu-short": Protocol(
        "cpu-short",
        "the cpu protocol at a quarter of its language-model token budgets (what a "
        "loaded 2-core machine finishes in a session; the MQAR cells and the GLUE results are the "
        "cpu protocol's, so C11 and C12 are not separate evidence)",
        _scaled(CPU_CELLS, 0.25, 16, 12),
        notes=CPU_SHORT_NOTES,
    ),
    "gpu-paper": _gpu(
        "gpu-paper",
        {"60m": 2_000_000_000, "150m": 4_000_000_000, "350m": 8_000_000_000},
        {"60m per run": 0.6, "150m per run": 2.5, "350m per run": 12.0, "total (45 runs)": 226.0},
        "60M/150M/350M presets on WikiText-103 (C1-C4, C7, C8, C13)",
    ),
}


BUDGET_LADDERS: dict[str, tuple[str, ...]] = {"cpu": ("cpu-short", "cpu"), "cpu-short": ("cpu-short", "cpu")}
"""Protocols whose language-model cells differ only in the token budget (and the budget-proportional warmup and
validation interval): the claims report of one pools their ``wv-tiny`` / ``wv-tiny-2x`` runs into the trend of
coupling's effect with training tokens. A protocol not listed pools only its own runs."""


def get_protocol(name: str) -> Protocol:
    """The protocol called ``name``; ``ValueError`` listing the known names otherwise."""
    choice("protocol", name, PROTOCOLS)
    return PROTOCOLS[name]

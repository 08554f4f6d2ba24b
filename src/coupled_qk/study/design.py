"""A study: stages of cells, claim tests bound to arms, and the plan its records give.

- :class:`Cell`: one block of runs, ``variants x seeds`` on one base configuration; every ``(variant, seed)`` of a
  cell uses the same data order and initial weights for a given seed, so variants are *paired by seed*. Runs
  are executed seed-major (all variants of seed 0, then seed 1 ...), so an interruption leaves complete pairs.
- A stage yields cells: :class:`Cells` a fixed list; :class:`LrGrid` every variant at each learning rate on a
  reserve seed (its choice and horizon feed later stages); :class:`Tuned` a cell at the grid's chosen rates and
  horizon (also on more tokens, or on a larger split of the documents: the fresh-data arm).
- :class:`Study`: the stages, the claim tests (:mod:`coupled_qk.study.claims`), the report's layout
  (:mod:`coupled_qk.study.report`) and what the command line may change (:attr:`Study.frozen`).

:meth:`Study.read` is the one record reader: it plans from the records and counts a record only when it sits at
its path, belongs to the plan (cell, variant, seed), has the plan's settings (:func:`~coupled_qk.study.records.
same_run_problem`) and holds every metric its cell declares as a finite number; any other record file is named
in :attr:`Reading.left_out`. Reports, plans, the runner and ``--verify`` all read through it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from coupled_qk.study.records import (
    LeftOut,
    metric_problem,
    path_problem,
    read_record_file,
    record_files,
    same_run_problem,
)

PRIMARY = "test/perplexity"
"""The metric claims read by default: held-out test perplexity of a language model."""


@dataclass(frozen=True)
class Cell:
    """One block of runs: ``variants x seeds`` on one base configuration.

    Attributes:
        name: folder-safe identifier (records go to ``runs/<study>/<name>/<variant>/seed<k>.json``).
        base: :class:`~coupled_qk.training.config.TrainConfig` fields shared by every run.
        variants: variant specs (``name[+field=value...]``).
        seeds: seeds (each seed fixes initialisation and data order).
        claims: the claim ids this cell feeds (for the progress table).
        heldout: the wiki-vital article split + WikiText-2 evaluation (:func:`coupled_qk.data.splits.heldout_corpus`).
        labels: what the report shows of the cell beside its name (e.g. an MQAR difficulty and learning rate).
        est_cpu_minutes: expected minutes per run on one idle CPU core (0 if not measured).
        seeds_of: the name of a cell this one adds seeds to (same base and variants, other seeds): claim tests read
            its records as that cell's.
        split: keyword arguments of :func:`coupled_qk.data.splits.document_split` (a training subset and an
            enlarged test split, written under the derived-data folder as the corpus ``base["corpus"]``).
        variant_base: per-variant fields over ``base`` (e.g. ``{"coupled": {"lr": 0.004}}``, a learning rate chosen
            by a grid stage).
        variant_fields: ``variant -> fields`` over ``base`` for a configuration that depends on the variant beyond
            its model overrides (an MQAR sweep point's), or ``None``.
        metrics: the final metrics every record of the cell must hold as finite numbers to be counted.
    """

    name: str
    base: dict
    variants: tuple[str, ...]
    seeds: tuple[int, ...]
    claims: tuple[str, ...] = ()
    heldout: bool = False
    labels: dict | None = None
    est_cpu_minutes: float = 0.0
    seeds_of: str | None = None
    split: dict | None = None
    variant_base: dict = field(default_factory=dict)
    variant_fields: Callable[[str], dict] | None = None
    metrics: tuple[str, ...] = (PRIMARY,)

    def __post_init__(self):
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.name):
            raise ValueError(f"Cell.name={self.name!r} must be folder-safe ([A-Za-z0-9_.-]+)")
        if not self.variants or not self.seeds:
            raise ValueError(f"Cell {self.name!r} needs at least one variant and one seed")

    def units(self) -> list[tuple[str, int]]:
        """``(variant, seed)`` pairs in execution order: seed-major, so interruptions leave complete pairs."""
        return [(v, s) for s in self.seeds for v in self.variants]

    def fields(self, variant: str) -> dict:
        """``base`` with the variant's own fields (``variant_fields``, then ``variant_base``) over it."""
        own = self.variant_fields(variant) if self.variant_fields is not None else {}
        return {**self.base, **own, **self.variant_base.get(variant, {})}

    def reads_corpus(self, variant: str) -> bool:
        """Whether the variant's runs read a corpus from a data folder (a language-modelling task)."""
        return self.fields(variant).get("task", "lm") == "lm"

    def config(self, variant: str, seed: int, run_dir: str | Path, data_dir: str | Path | None):
        """The :class:`~coupled_qk.training.config.TrainConfig` of one run: the cell's fields for ``variant``,
        the variant's model overrides (:func:`~coupled_qk.models.specs.variant_overrides`) over the base model,
        ``seed``, the run folder and (for a corpus-reading cell) the data folder; no progress bars, no TensorBoard.

        Raises:
            ValueError: an invalid variant spec or configuration.
        """
        from coupled_qk.models.specs import variant_overrides
        from coupled_qk.training.config import TrainConfig

        fields = self.fields(variant)
        model = {**fields.pop("model", {}), **variant_overrides(variant)}
        fields.update(seed=seed, out_dir=str(run_dir), tensorboard=False, progress=False)
        fields["data_dir"] = str(data_dir) if data_dir is not None and self.reads_corpus(variant) else None
        return TrainConfig(**fields, model=model)

    def budget(self, variant: str) -> str:
        """``"max_tokens 1,048,576"`` or ``"max_steps 6"``: the run's budget, for plans."""
        fields = self.fields(variant)
        if fields.get("max_tokens"):
            return f"max_tokens {fields['max_tokens']:,}"
        return f"max_steps {fields.get('max_steps')}"


@dataclass(frozen=True)
class Unit:
    """One run of a plan: its stage, cell, variant and seed."""

    stage: str
    cell: Cell
    variant: str
    seed: int

    @property
    def key(self) -> tuple[str, str, int]:
        """``(cell name, variant, seed)``: how records are indexed."""
        return self.cell.name, self.variant, self.seed


@dataclass
class Plan:
    """What a study runs, given its records so far.

    Attributes:
        cells: ``(stage, cell)`` in execution order: every cell that can be planned now.
        waiting: a line per group of stages that cannot be planned yet, and why.
        chosen_lr: variant -> learning rate, once a grid stage is complete.
        epochs: the horizon of the stages tuned by a grid (``None`` until the grid is complete).
        grid: variant -> {lr: best validation loss} of the finished grid runs.
        expected: cell name -> seeds of the cells that waiting stages will plan.
    """

    cells: list[tuple[str, Cell]]
    waiting: list[str] = field(default_factory=list)
    chosen_lr: dict = field(default_factory=dict)
    epochs: float | None = None
    grid: dict = field(default_factory=dict)
    expected: dict = field(default_factory=dict)

    def units(self) -> list[Unit]:
        """Every run of the plan in execution order (cells in order, seed-major inside a cell)."""
        return [Unit(stage, cell, v, s) for stage, cell in self.cells for v, s in cell.units()]

    def cell(self, name: str) -> Cell | None:
        """The planned cell called ``name``, or ``None``."""
        return next((c for _, c in self.cells if c.name == name), None)


@dataclass(frozen=True)
class Cells:
    """A stage of fixed cells (every first-epoch protocol is one)."""

    cells: tuple[Cell, ...]
    name: str = "cells"
    waits_for = None

    def plan(self, study: Study, records: dict, plan: Plan) -> bool:
        """Add the cells to ``plan``; always complete."""
        plan.cells += [(self.name, c) for c in self.cells]
        return True


@dataclass(frozen=True)
class Study:
    """A named study: stages of cells, claim tests bound to arms, a report layout.

    Attributes:
        name: the study's name (records go to ``<out_dir>/runs/<name>/...``).
        description: one line for reports and plans.
        stages: the stages, in order (:class:`Cells`, :class:`LrGrid`, :class:`Tuned`).
        claims: the claim tests bound to this study's arms (:class:`coupled_qk.study.claims.Claim`), in report order.
        layout: how the report shows them (:mod:`coupled_qk.study.report`).
        notes: what a reader needs to judge the study that is not a date or a measurement (those are in
            ``docs/results/STUDIES.md``, which the report adds).
        frozen: pre-registered: its seeds, variants and cells are not changed from the command line.
        runnable: ``False`` for a study defined (planned, costed, reported as not run) but not run here.
        needs_gpu: the study runs only where a GPU is present (its plan and report work anywhere).
        expected_hours: estimates shown in the report of a study not run here.
        default_out_dir: where its report and records go unless ``--out-dir`` says otherwise.
        tokens_per_second: expected training throughput per run, for the plan's cost estimate (``None``: no estimate).
        extra_variants: variants added to every cell from the command line (:meth:`with_variants`).
        min_seeds: the fewest paired seeds a claim reads (default: 2, or 3 where every cell has them).
    """

    name: str
    description: str
    stages: tuple = ()
    claims: tuple = ()
    layout: object = None
    notes: tuple[str, ...] = ()
    frozen: bool = False
    runnable: bool = True
    needs_gpu: bool = False
    expected_hours: dict = field(default_factory=dict)
    default_out_dir: str = "docs/results/claims"
    tokens_per_second: float | None = None
    extra_variants: tuple[str, ...] = ()
    min_seeds: int | None = None

    def __post_init__(self):
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.name) or self.name in (".", ".."):
            raise ValueError(f"Study.name={self.name!r} must be folder-safe ([A-Za-z0-9_.-]+)")

    @property
    def static(self) -> bool:
        """Whether every stage is a fixed list of cells (the plan does not depend on records)."""
        return all(isinstance(s, Cells) for s in self.stages)

    @property
    def cells(self) -> tuple[Cell, ...]:
        """The cells of a static study (``ValueError`` for a study whose plan depends on its records)."""
        if not self.static:
            raise ValueError(f"study {self.name!r} plans its cells from its records: use plan() or read()")
        return tuple(c for s in self.stages for c in s.cells)

    def cell(self, name: str) -> Cell:
        """The cell called ``name`` of a static study (``KeyError`` if absent)."""
        for c in self.cells:
            if c.name == name:
                return c
        raise KeyError(name)

    def has_cell(self, name: str) -> bool:
        """Whether a static study defines a cell called ``name``."""
        return any(c.name == name for c in self.cells)

    def reads_wikitext2(self) -> bool:
        """Whether any cell of a static study adds the (deferrable) WikiText-2 evaluation."""
        return self.static and any(c.heldout for c in self.cells)

    def plan(self, records: dict) -> Plan:
        """The cells of the study given ``records`` (``{(cell, variant, seed): record}``, counted runs only).

        Stages plan in order (each adds its cells and says whether it is complete); the stages after an incomplete
        one wait for it (a grid's choice), in one line of :attr:`Plan.waiting`.
        Deterministic: the same records always give the same plan, so an interrupted study resumes where it stopped.
        """
        plan = Plan([])
        waiting: list[str] = []
        blocked_by = None
        for stage in self.stages:
            if blocked_by is not None:
                waiting.append(stage.name)
                plan.expected.update(stage.expected_cells(self))
            elif not stage.plan(self, records, plan):
                blocked_by = stage.waits_for
        if waiting:
            plan.waiting = [f"{', '.join(waiting)}: wait for {blocked_by}"]
        return plan

    def with_seeds(self, seeds) -> Study:
        """The same (static) study with every cell's seeds replaced (``--seeds``)."""
        cells = tuple(dataclasses.replace(c, seeds=tuple(seeds)) for c in self.cells)
        return dataclasses.replace(self, stages=(Cells(cells),))

    def with_variants(self, specs) -> Study:
        """The same (static) study with the variant specs ``specs`` (any registered variant, plugins included,
        optionally ``+field=value``) trained in every cell next to the cell's own variants, paired by seed; the
        report compares each with the cell's ``standard`` runs. Specs a cell already has are not repeated.

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
        return dataclasses.replace(self, stages=(Cells(cells),), extra_variants=self.extra_variants + extra)

    def read(self, out_dir: str | Path, damaged: str = "raise", here: bool = False) -> Reading:
        """Read the study's records under ``out_dir`` and plan from them (see the module docstring).

        Args:
            out_dir: the report folder (records under ``out_dir/runs/<name>``).
            damaged: ``"raise"`` (reports, plans) or ``"skip"`` (the runner trains a damaged record's run again).
            here: compare a record's precision with the one this machine would train in (the runner, which trains
                here); otherwise only with a precision the plan fixes (``dtype`` other than ``auto``), so that a
                report does not depend on the machine it is made on.

        Raises:
            ValueError: naming the file, for one that is damaged (with ``damaged="raise"``) or not a run record.
        """
        files = []
        for path in record_files(out_dir, self.name):
            rec = read_record_file(path, damaged=damaged)
            if rec is not None:
                files.append((path, rec))
        counted: dict = {}
        configs: dict = {}
        for _ in range(8):  # a plan depends on the counted records (a grid's choice): until both agree
            plan = self.plan(counted)
            reading = _classify(self, plan, files, out_dir, here, configs)
            if reading.counted.keys() == counted.keys():
                return reading
            counted = reading.counted
        raise RuntimeError(f"the plan of study {self.name!r} does not settle on its records")  # pragma: no cover


@dataclass
class Reading:
    """The records of a study as its plan reads them (:meth:`Study.read`).

    Attributes:
        plan: the plan made from the counted records.
        counted: ``{(cell, variant, seed): record}`` of the records a report counts.
        done: keys whose record is the planned run (counted, or left out only for a metric it lacks: the runner
            does not train them again).
        stale: ``{key: why}`` for planned runs whose record is another run (other settings or precision): the
            runner trains them again and replaces the record.
        left_out: every record file not counted, and why.
    """

    plan: Plan
    counted: dict
    done: set
    stale: dict
    left_out: list[LeftOut]

    def by_key(self) -> dict:
        """:attr:`counted`, with the records of a cell with ``seeds_of`` also under that cell (more seeds of the
        same runs)."""
        out = dict(self.counted)
        for (cell, variant, seed), rec in self.counted.items():
            planned = self.plan.cell(cell)
            if planned is not None and planned.seeds_of is not None:
                out.setdefault((planned.seeds_of, variant, seed), rec)
        return out


def _classify(study: Study, plan: Plan, files: list, out_dir, here: bool, configs: dict) -> Reading:
    """Sort the record files of ``study`` against ``plan`` (see :meth:`Study.read`); ``configs`` caches the planned
    configuration of each run across the reader's passes."""
    units = {u.key: u for u in plan.units()}
    counted, done, stale, left_out = {}, set(), {}, []
    for path, rec in files:
        key = (rec["cell"], rec["variant"], rec["seed"])
        reason = path_problem(path, rec, out_dir, study.name) or _planned_problem(plan, key)
        unit = units.get(key)
        if reason is None:
            cache_key = (*unit.key, json.dumps(unit.cell.fields(unit.variant), sort_keys=True, default=str))
            if cache_key not in configs:
                configs[cache_key] = unit.cell.config(unit.variant, unit.seed, Path("run"), Path("data"))
            cfg = configs[cache_key]
            reason = same_run_problem(rec, cfg, here)
            if reason is not None:
                stale[key] = reason
        if reason is None:
            done.add(key)
            reason = metric_problem(rec, unit.cell.metrics)
        if reason is None:
            counted[key] = rec
        else:
            left_out.append(LeftOut(path, reason))
    return Reading(plan, counted, done, stale, left_out)


def _planned_problem(plan: Plan, key) -> str | None:
    """Why the run ``key`` is not in ``plan`` (another cell, variant or seed), or ``None``."""
    cell_name, variant, seed = key
    cell = plan.cell(cell_name)
    if cell is None:
        if plan.waiting:
            return f"not planned yet ({'; '.join(plan.waiting)})"
        return f"cell {cell_name!r} is not in the plan (cells: {[c.name for _, c in plan.cells]})"
    if variant not in cell.variants:
        return f"variant {variant!r} is not planned in cell {cell_name!r} ({', '.join(cell.variants)})"
    if seed not in cell.seeds:
        return f"seed {seed} is not planned in cell {cell_name!r} (seeds {', '.join(map(str, cell.seeds))})"
    return None

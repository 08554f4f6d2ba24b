"""Stages trained to a plateau: a learning-rate grid whose choice and horizon feed the stages after it.

The first-epoch studies stop every run inside its first or second epoch, at one learning rate for every variant.
A study built from these stages answers the paper's question instead: each model is trained to its plateau, at
its own tuned learning rate, with paired initialisation, and evaluated from its best-validation checkpoint.

1. :class:`LrGrid`: every variant at each learning rate of ``lrs`` on the reserve seed (never used for verdicts);
   when a variant's best rate is at an edge of what was tried, the next rate beyond it (x0.5 or x2) is added
   once. The chosen rate minimises the best validation loss (ties: the smaller rate). The horizon: if every
   chosen rate's grid run plateaued (:func:`plateaued`) the stages after it train ``epochs``, else
   ``long_epochs``.
2. :class:`Tuned`: a cell of the given variants and seeds at their chosen rates and the horizon, on ``tokens``
   times the tokens of the same text (a compute-matched arm), or on ``data`` times the training documents of the
   split (a fresh-data arm: a superset of the training documents, the same validation and test documents, its
   own tokenizer, as many epochs).

Every rule here is fixed before a study's first run (pre-registered): the grid, the plateau rule and the order.
"""

from __future__ import annotations

from dataclasses import dataclass

from coupled_qk.study.design import Cell, Plan

PLATEAU_WINDOW_EPOCHS = 0.5  # the last half epoch of validations ...
PLATEAU_TOLERANCE = 0.005  # ... improves the best validation loss before it by less than 0.5% (relative)
CONVERGED_METRICS = ("test/perplexity", "valid/loss")
"""The metrics every record of a tuned study holds (held-out perplexity; the validation loss its grid reads)."""


@dataclass(frozen=True)
class EpochBudget:
    """The budget rule shared by a grid and the stages it tunes: epochs of one training split.

    Attributes:
        base: :class:`~coupled_qk.training.config.TrainConfig` fields of every run (``lr``, ``max_tokens`` and
            ``eval_interval`` are set per stage).
        split: :func:`~coupled_qk.data.splits.document_split` options (``base["corpus"]`` names the folder), or
            ``None`` for a corpus with its own splits (WikiText-103).
        train_tokens: training tokens of one epoch (records store the exact epochs of each run).
        epochs / long_epochs: the horizon, and the one used when the grid runs did not plateau.
        evals_per_epoch: full validations per epoch (the best checkpoint and patience act on them).
    """

    base: dict
    split: dict | None
    train_tokens: int
    epochs: float
    long_epochs: float
    evals_per_epoch: int

    @property
    def tokens_per_step(self) -> int:
        """Training tokens per optimiser step (batch x accumulation x block size)."""
        from coupled_qk.models.config import PRESETS

        block = self.base.get("model", {}).get("block_size") or PRESETS[self.base["preset"]]["block_size"]
        return self.base["batch_size"] * self.base.get("grad_accum", 1) * block

    def eval_interval(self) -> int:
        """Steps between full validations: ``1 / evals_per_epoch`` of an epoch."""
        return max(1, round(self.train_tokens / self.tokens_per_step / self.evals_per_epoch))

    def cell_base(self, epochs: float, lr: float | None = None) -> dict:
        """``base`` with the budget of ``epochs`` epochs and the validation interval filled in."""
        out = {**self.base, "max_tokens": int(round(epochs * self.train_tokens)), "eval_interval": self.eval_interval()}
        return out if lr is None else {**out, "lr": lr}


def lr_tag(lr: float) -> str:
    """``0.002`` -> ``0.002``, ``0.0012`` -> ``0.0012`` (folder-safe, distinct for distinct rates)."""
    return f"{lr:g}"


def best_loss(rec: dict) -> float:
    """A record's best validation loss (the best checkpoint's, else its final validation loss).

    Raises:
        ValueError: naming the record, when it holds neither as a number.
    """
    best = rec.get("best") or {}
    value = best.get("value") if best.get("metric") == "valid/loss" else (rec.get("final") or {}).get("valid/loss")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(
            f"record {rec.get('cell')}/{rec.get('variant')}/seed{rec.get('seed')} has no best validation "
            f"loss (best['value'] with metric valid/loss, else final['valid/loss']; got {value!r})"
        )
    return float(value)


def plateaued(rec: dict) -> bool:
    """Whether a run met the plateau rule (it sets a horizon; it does not show a minimum): stopped by patience, or
    its validation loss over the last ``PLATEAU_WINDOW_EPOCHS`` of the run improved its best before that window by
    less than ``PLATEAU_TOLERANCE`` (relative)."""
    if rec.get("stop_reason") == "patience":
        return True
    curve = rec.get("curve", {}).get("valid", [])
    epochs, tokens = rec.get("epochs"), rec.get("tokens")
    if not curve or not epochs or not tokens:
        return False
    per_epoch = tokens / epochs
    cut = tokens - PLATEAU_WINDOW_EPOCHS * per_epoch
    before = [loss for t, loss in curve if t <= cut]
    after = [loss for t, loss in curve if t > cut]
    if not before or not after:
        return False
    return (min(before) - min(after)) / min(before) < PLATEAU_TOLERANCE


@dataclass(frozen=True)
class LrGrid:
    """Every variant at each rate of ``lrs`` on ``reserve_seed`` (see the module docstring).

    Attributes:
        budget: the epoch budget (its ``epochs`` is the grid's horizon).
        variants: the variants tuned (each gets its own rate).
        lrs: the grid's learning rates; reserve_seed: its seed (never in a verdict).
    """

    budget: EpochBudget
    variants: tuple[str, ...]
    lrs: tuple[float, ...]
    reserve_seed: int
    name: str = "grid"
    waits_for = "the learning-rate grid"

    def cell(self, study, lr: float, variants) -> Cell:
        """The grid cell of ``variants`` at ``lr``: ``<study>-grid-lr<rate>``."""
        return Cell(
            f"{study.name}-grid-lr{lr_tag(lr)}",
            self.budget.cell_base(self.budget.epochs, lr),
            tuple(variants),
            (self.reserve_seed,),
            ("lr",),
            split=self.budget.split,
            metrics=CONVERGED_METRICS,
        )

    def plan(self, study, records: dict, plan: Plan) -> bool:
        """Add the grid's cells (the base grid, then at most one extension per edge and variant) to ``plan``;
        when every variant's grid is finished, set its chosen rates, the horizon and the grid's losses. Returns
        whether the grid is complete."""
        grid: dict = {v: {} for v in self.variants}
        plan.cells += [(self.name, self.cell(study, lr, self.variants)) for lr in self.lrs]
        for variant in self.variants:
            for lr in self.lrs:
                rec = records.get((self.cell(study, lr, self.variants).name, variant, self.reserve_seed))
                if rec is not None:
                    grid[variant][lr] = best_loss(rec)
        complete = all(len(grid[v]) == len(self.lrs) for v in self.variants)
        extensions: dict = {}
        for variant in (v for v in self.variants if len(grid[v]) == len(self.lrs)):
            best = min(sorted(grid[variant]), key=lambda lr: grid[variant][lr])
            lo, hi = min(self.lrs), max(self.lrs)
            if best in (lo, hi):
                extensions.setdefault(lo / 2 if best == lo else hi * 2, []).append(variant)
        for extra in sorted(extensions):
            cell = self.cell(study, extra, tuple(v for v in self.variants if v in extensions[extra]))
            plan.cells.append((self.name, cell))
            for variant in cell.variants:
                rec = records.get((cell.name, variant, self.reserve_seed))
                if rec is None:
                    complete = False
                else:
                    grid[variant][extra] = best_loss(rec)
        plan.grid = grid
        if complete:
            plan.chosen_lr = {v: min(sorted(grid[v]), key=lambda lr: grid[v][lr]) for v in self.variants}
            chosen = [
                records.get((f"{study.name}-grid-lr{lr_tag(plan.chosen_lr[v])}", v, self.reserve_seed))
                for v in self.variants
            ]
            plateau = all(r is not None and plateaued(r) for r in chosen)
            plan.epochs = self.budget.epochs if plateau else self.budget.long_epochs
        return complete

    def expected_runs(self) -> int:
        """Runs of the base grid (extensions not counted), for cost estimates before it is planned."""
        return len(self.variants) * len(self.lrs)


@dataclass(frozen=True)
class Tuned:
    """A cell at the grid's chosen rates and horizon: ``<study>-<name>``.

    Attributes:
        name: the stage's name (``main``, ``matched``, ``uncoupled``, ``fresh``).
        budget: the grid's epoch budget.
        variants, seeds: the cell's.
        claims: the claim ids it feeds.
        tokens: multiple of the horizon's tokens, on the same text (a compute-matched arm trains ``tokens`` times
            the epochs under a ``tokens`` times longer schedule).
        data: multiple of the training documents (a fresh-data arm: the split's ``train_fraction`` times ``data``,
            written as the corpus ``<corpus>-x<data>`` with its own tokenizer; the same number of epochs, so
            ``data`` times the tokens, and a validation every ``data`` times the interval: about the same share of
            an epoch).
    """

    name: str
    budget: EpochBudget
    variants: tuple[str, ...]
    seeds: tuple[int, ...]
    claims: tuple[str, ...]
    tokens: float = 1.0
    data: float = 1.0

    def cell(self, study, epochs: float, chosen: dict) -> Cell:
        """The stage's cell at horizon ``epochs`` and rates ``chosen`` (variant -> lr).

        Raises:
            ValueError: a fresh-data stage of a budget without a document split, or an enlarged fraction above 1.
        """
        base, split = self.budget.cell_base(epochs * self.tokens * self.data), self.budget.split
        if self.data != 1:
            if not split:
                raise ValueError(f"study {study.name!r} has no document split: a fresh-data stage needs one")
            fraction = round(split["train_fraction"] * self.data, 6)
            if fraction > 1:
                raise ValueError(f"train_fraction {split['train_fraction']} x {self.data} = {fraction} > 1")
            base["corpus"] = f"{self.budget.base['corpus']}-x{self.data:g}"
            base["eval_interval"] = max(1, round(self.budget.eval_interval() * self.data))
            split = {**split, "train_fraction": fraction}
        return Cell(
            f"{study.name}-{self.name}",
            base,
            self.variants,
            self.seeds,
            self.claims,
            split=split,
            variant_base={v: {"lr": chosen[v]} for v in self.variants},
            metrics=CONVERGED_METRICS,
        )

    def plan(self, study, records: dict, plan: Plan) -> bool:
        """Add the cell at the plan's chosen rates and horizon (set by the grid before it)."""
        if plan.epochs is None:
            raise ValueError(f"stage {self.name!r} of study {study.name!r} needs a learning-rate grid before it")
        plan.cells.append((self.name, self.cell(study, plan.epochs, plan.chosen_lr)))
        return True

    def expected_runs(self) -> int:
        """The stage's runs."""
        return len(self.variants) * len(self.seeds)

    def expected_cells(self, study) -> dict:
        """``{cell name: seeds}`` of the cell this stage plans once the grid is complete."""
        return {f"{study.name}-{self.name}": self.seeds}

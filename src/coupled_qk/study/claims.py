"""Claim tests: generic classes applied to arms (a cell's runs of one variant) and a metric, with one verdict
vocabulary (``docs/METHOD.md`` section 3).

Every verdict is computed from the run records by a fixed rule:

* direction claims ("A beats B", :class:`PairedChange`): ``reproduced`` if the 95% interval of the paired effect
  lies entirely on the claimed side of zero, ``contradicted`` if it lies entirely on the other side, otherwise
  ``not reproduced at this scale`` (no difference resolved by this many seeds);
* equivalence claims ("A and B perform identically", :class:`Equivalence`): ``reproduced`` if the interval lies
  inside ``+-margin`` percent, ``contradicted`` if it lies entirely outside, otherwise not reproduced;
* ``not run`` with the reason (runs not finished, study not run here, results of another study missing).

A claim test reads :class:`Evidence` (a study's counted records and its plan) through arms (:class:`Arm`), so the
same test is bound to different cells in different studies (C1 is a :class:`PairedChange` of standard and coupled
in the first-epoch and the converged studies alike), and an arm may name another study (:attr:`Arm.study`) for a
claim across studies. :meth:`ClaimTest.evaluate` returns the claim's row: ``effect, mean, low, high, n, p,
verdict, tokens, train_hours, details``; it raises :class:`NotReady` while runs it needs are missing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from coupled_qk.study import stats
from coupled_qk.study.design import PRIMARY, Plan

VERDICTS = ("reproduced", "not reproduced at this scale", "contradicted", "not run")
"""The one verdict vocabulary of every claim row."""
NULL = VERDICTS[1]


class NotReady(Exception):
    """Raised inside a claim test when the runs it needs are missing; the message is the reason."""


def direction_verdict(low: float, high: float, expect: str) -> str:
    """Verdict of a direction claim from an interval: ``expect`` is ``"negative"`` or ``"positive"``."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return NULL
    below, above = high < 0, low > 0
    good, bad = (below, above) if expect == "negative" else (above, below)
    return "reproduced" if good else "contradicted" if bad else NULL


def equivalence_verdict(low: float, high: float, margin: float) -> str:
    """Verdict of an equivalence claim: interval inside ``+-margin`` -> reproduced, entirely outside -> contradicted."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return NULL
    if -margin < low and high < margin:
        return "reproduced"
    return "contradicted" if (low > margin or high < -margin) else NULL


def joint_verdict(verdicts) -> str:
    """Several conditions of one claim: contradicted if any is, reproduced if all are, else not reproduced."""
    verdicts = list(verdicts)
    if "contradicted" in verdicts:
        return "contradicted"
    return "reproduced" if set(verdicts) == {"reproduced"} else NULL


@dataclass(frozen=True)
class Arm:
    """A named role resolved to runs: the records of ``variant`` in ``cell``, paired with other arms by seed.

    Attributes:
        cell, variant: where the runs are.
        study: another study whose records hold the arm (``None``: the study the claim belongs to).
        per_tokens_of: an arm of the same validation and test text scored with another tokenizer: this arm's records
            are read in that arm's token counts (:func:`coupled_qk.study.rescale.to_reference`, same seed).
    """

    cell: str
    variant: str
    study: str | None = None
    per_tokens_of: Arm | None = None

    @property
    def key(self) -> tuple[str, str]:
        """``(cell, variant)``: the arm's key in a study's records."""
        return self.cell, self.variant

    @property
    def label(self) -> str:
        """``"coupled (wv-tiny)"``."""
        return f"{self.variant} ({self.cell})"


def arm(x) -> Arm:
    """An :class:`Arm` from an arm or a ``(cell, variant)`` pair."""
    return x if isinstance(x, Arm) else Arm(*x)


def _duration(minutes: float, prefix: str = "") -> str:
    """``90 -> '1.5 hours'``, ``4 -> '4 minutes'`` (with ``prefix``, e.g. ``'CPU-'``, before the unit)."""
    return f"{minutes / 60:.1f} {prefix}hours" if minutes >= 60 else f"{max(1, round(minutes))} {prefix}minutes"


class Evidence:
    """What claim tests read: a study's counted records (by ``(cell, variant, seed)``) and its plan.

    Args:
        study: the study's name.
        plan: its plan (:class:`~coupled_qk.study.design.Plan`).
        by_key: counted records, a ``seeds_of`` cell's also under its base cell
            (:meth:`~coupled_qk.study.design.Reading.by_key`).
        min_seeds: the fewest paired seeds a test accepts.
        partial: :meth:`need` accepts unfinished cells (provisional numbers, interim status).
        studies: ``name -> Evidence`` of another study, for arms that name one.
        inputs: files a claim test reads besides the records (e.g. ``{"glue_json": path}``).
    """

    def __init__(
        self,
        study: str,
        plan: Plan,
        by_key: dict,
        min_seeds: int = 3,
        partial: bool = False,
        studies: Callable[[str], Evidence] | None = None,
        inputs: dict | None = None,
    ):
        self.study, self.plan, self.by_key = study, plan, by_key
        self.min_seeds, self.partial, self.studies = min_seeds, partial, studies
        self.inputs = inputs or {}

    def but(self, **changes) -> Evidence:
        """The same evidence with ``min_seeds`` or ``partial`` changed."""
        kw = dict(min_seeds=self.min_seeds, partial=self.partial, studies=self.studies, inputs=self.inputs)
        return Evidence(self.study, self.plan, self.by_key, **{**kw, **changes})

    def of(self, a: Arm) -> Evidence:
        """The evidence holding arm ``a``'s records (another study's for :attr:`Arm.study`)."""
        if a.study is None or a.study == self.study:
            return self
        if self.studies is None:
            raise NotReady(f"the records of study {a.study!r} are not available here")
        return self.studies(a.study)

    def record(self, a, seed: int) -> dict | None:
        """Arm ``a``'s record of ``seed`` (read per token of :attr:`Arm.per_tokens_of` where set), or ``None``."""
        a = arm(a)
        ev = self.of(a)
        rec = ev.by_key.get((*a.key, seed))
        if rec is None or a.per_tokens_of is None:
            return rec
        from coupled_qk.study.rescale import to_reference

        ref = ev.record(a.per_tokens_of, seed)
        return None if ref is None else to_reference(rec, ref)

    def seeds(self, a) -> list[int]:
        """Seeds with a record of arm ``a`` (sorted)."""
        a = arm(a)
        ev = self.of(a)
        return sorted(s for (c, v, s) in ev.by_key if (c, v) == a.key and self.record(a, s) is not None)

    def values(self, a, variant: str | None = None, metric: str = PRIMARY) -> dict[int, float]:
        """``{seed: value}`` of a final metric (or ``diagnostics/<name>``) of arm ``a`` (or cell ``a`` and
        ``variant``) over its finished runs, finite values only."""
        from coupled_qk.study.records import is_number, metric_value

        a = arm(a if variant is None else (a, variant))
        out = {}
        for s in self.seeds(a):
            value = metric_value(self.record(a, s), metric)
            if is_number(value):
                out[s] = float(value)
        return out

    def need(self, *items) -> None:
        """Raise :class:`NotReady` naming what is missing unless every planned run of ``items`` has a record.

        An item is a cell name (all its variants) or an arm / ``(cell, variant)`` pair (that variant's seeds).
        """
        if self.partial:
            return
        missing, minutes, total = 0, 0.0, 0
        wanted = [(i, None) if isinstance(i, str) else arm(i).key for i in items]
        cells = tuple(dict.fromkeys(name for name, _ in wanted))
        for name, only in dict.fromkeys(wanted):
            cell = self.plan.cell(name)
            if cell is None:
                raise NotReady(f"protocol {self.study!r} has no cell {name!r}")
            for v, s in cell.units():
                if only is not None and v != only:
                    continue
                total += 1
                if (name, v, s) not in self.by_key:
                    missing += 1
                    minutes += cell.est_cpu_minutes
        if missing:
            label = ", ".join(cells) if len(cells) <= 3 else f"{len(cells)} cells ({cells[0]} ... {cells[-1]})"
            done = self.runs(*cells)
            pace = ""
            if done:
                per_run = sum(r["wall_seconds"] for r in done) / len(done) / 60
                pace = (
                    f"; at the {per_run:.0f} minutes per run its finished runs took, about "
                    f"{_duration(missing * per_run)} in one process"
                )
            rest = f"the other {missing} take" if missing > 1 else "the other one takes"
            raise NotReady(
                f"in progress: {total - missing} of {total} runs of {label} finished; {rest} about "
                f"{_duration(minutes, 'CPU-')} on an idle core{pace}"
            )

    def pairs(self, a, b, metric: str = PRIMARY) -> tuple[list, list, list]:
        """Values of arms ``a`` and ``b`` on their common seeds (sorted): ``(seeds, va, vb)``.

        Raises:
            NotReady: fewer than :attr:`min_seeds` common seeds.
        """
        va, vb = self.values(a, metric=metric), self.values(b, metric=metric)
        seeds = sorted(set(va) & set(vb))
        if len(seeds) < self.min_seeds:
            a, b = arm(a).key, arm(b).key
            raise NotReady(f"{len(seeds)} paired seeds of {a} vs {b}; at least {self.min_seeds} needed")
        return seeds, [va[s] for s in seeds], [vb[s] for s in seeds]

    def expected_seeds(self, cell: str) -> tuple[int, ...]:
        """The seeds the study plans for ``cell`` (also before the cell can be planned: a stage's declared seeds)."""
        planned = self.plan.cell(cell)
        return planned.seeds if planned is not None else self.plan.expected.get(cell, ())

    def runs(self, *cells: str) -> list[dict]:
        """Records of the given cells (a ``seeds_of`` cell's under its base cell too)."""
        return [r for (c, _, _), r in self.by_key.items() if c in cells]


def claim_row(effect: str, r: dict, verdict: str, runs: list[dict], **details) -> dict:
    """A claim's row from its statistic ``r`` (``mean, low, high, n`` and optionally ``p``): the training tokens
    and hours of ``runs`` and the claim's ``details``."""
    tokens = sorted({x["tokens"] for x in runs})
    return {
        "effect": effect,
        "mean": r["mean"],
        "low": r["low"],
        "high": r["high"],
        "n": r["n"],
        "p": r.get("p"),
        "verdict": verdict,
        "tokens": tokens,
        "train_hours": sum(x["train_seconds"] for x in runs) / 3600,
        "details": details,
    }


def _cells(*arms) -> tuple[str, ...]:
    return tuple(dict.fromkeys(arm(a).cell for a in arms))


@dataclass(frozen=True)
class PairedChange:
    """``b`` against ``a``, paired by seed: the per-seed change of ``metric`` (relative, in percent, or absolute),
    its mean and t interval; a direction claim (``expect``: ``"negative"`` or ``"positive"``).

    Attributes:
        a, b: the arms (reference, changed).
        label: the effect's description in the report.
        expect: the claimed sign of the change.
        metric: the metric compared (default held-out test perplexity).
        relative: percent change ``100 (b / a - 1)`` (else ``b - a``).
        secondary: a second metric shown beside it (e.g. WikiText-2 test perplexity), if both arms have it.
        also: diagnostics compared beside it as absolute paired differences (``<name>_coupled_minus_standard``).
        correlation: an analysis over the study's runs shown in the details (:class:`Correlation`).
        cells: the cells whose runs the row's tokens and hours sum (default: the arms' cells).
    """

    a: Arm
    b: Arm
    label: str
    expect: str = "negative"
    metric: str = PRIMARY
    relative: bool = True
    secondary: str | None = None
    also: tuple[str, ...] = ()
    correlation: object = None
    cells: tuple[str, ...] = ()

    def measure(self, ev: Evidence) -> tuple[list, list, list]:
        """``(seeds, values of a, values of b)`` on the arms' common seeds."""
        return ev.pairs(self.a, self.b, self.metric)

    def evaluate(self, ev: Evidence) -> dict:
        """The row of the paired change: :func:`~coupled_qk.study.stats.paired_difference` of ``b`` vs ``a`` on
        their common seeds (t interval of the mean per-seed change), :func:`direction_verdict` with ``expect``;
        details: each arm's mean interval and the per-seed changes (or the ``also`` diagnostics and the
        correlation), the ``secondary`` metric's change where both arms have it.

        Raises:
            NotReady: a planned run of either arm missing, or fewer than ``ev.min_seeds`` paired seeds.
        """
        ev.need(self.a, self.b)
        _, va, vb = self.measure(ev)
        r = stats.paired_difference(va, vb, relative=self.relative)
        runs = ev.runs(*(self.cells or _cells(self.a, self.b)))
        verdict = direction_verdict(r["low"], r["high"], self.expect)
        if self.also or self.correlation is not None:
            return claim_row(self.label, r, verdict, runs, **self._diagnostics(ev))
        details = {
            "a": self.a.label,
            "b": self.b.label,
            "a_ppl": stats.mean_ci(va),
            "b_ppl": stats.mean_ci(vb),
            "per_seed_percent": r["differences"],
        }
        if self.secondary is not None:
            try:
                _, oa, ob = ev.pairs(self.a, self.b, self.secondary)
                details["wikitext2_test_percent"] = stats.paired_difference(oa, ob, relative=True)
            except NotReady:
                details["wikitext2_test_percent"] = "pending (WikiText-2 evaluation not finished)"
        return claim_row(self.label, r, verdict, runs, **details)

    def _diagnostics(self, ev: Evidence) -> dict:
        details = {}
        for name in self.also:
            try:
                _, a, b = ev.pairs(self.a, self.b, f"diagnostics/{name}")
                details[f"{name}_coupled_minus_standard"] = stats.paired_difference(a, b)
            except NotReady:
                pass
        if self.correlation is not None:
            details[self.correlation.name] = self.correlation.evaluate(ev)
        return details


@dataclass(frozen=True)
class Equivalence:
    """``b`` (or each arm of ``bs``) against ``a``, paired by seed, in percent: equivalent if the interval lies
    inside ``+-margin``. With several arms the verdict is joint (:func:`joint_verdict`) and the row shows the
    interval reaching furthest from zero.

    Attributes:
        a: the reference arm; b: the compared arm, or bs: ``{key: arm}`` of several (shown per key under
            ``per_name``).
        label: the effect's description; margin: the equivalence margin in percent.
        reading: the words for an interval inside the margin where a layout reads intervals in words.
    """

    a: Arm
    label: str
    margin: float
    b: Arm | None = None
    bs: dict = field(default_factory=dict)
    per_name: str = "per_arm"
    metric: str = PRIMARY
    reading: str = "equivalent"

    def arms(self) -> list[Arm]:
        """The compared arms."""
        return [self.b] if self.b is not None else list(self.bs.values())

    def measure(self, ev: Evidence) -> tuple[list, list, list]:
        """``(seeds, values of a, values of b)`` of the single compared arm on the arms' common seeds."""
        return ev.pairs(self.a, self.b, self.metric)

    def evaluate(self, ev: Evidence) -> dict:
        """The row of the equivalence test: the paired percent change of each compared arm vs ``a``
        (:func:`~coupled_qk.study.stats.paired_difference`, t interval), :func:`equivalence_verdict` with ``margin``
        (joint over ``bs``, whose row shows the interval reaching furthest from zero); ``p`` is ``None`` (an
        equivalence test has none here).

        Raises:
            NotReady: a planned run missing, or fewer than ``ev.min_seeds`` paired seeds.
        """
        ev.need(self.a, *self.arms())
        runs = ev.runs(*_cells(self.a, *self.arms()))
        if self.b is not None:
            _, va, vb = ev.pairs(self.a, self.b, self.metric)
            r = stats.paired_difference(va, vb, relative=True)
            verdict = equivalence_verdict(r["low"], r["high"], self.margin)
            return claim_row(self.label, {**r, "p": None}, verdict, runs, per_seed_percent=r["differences"])
        per = {}
        for key, b in self.bs.items():
            _, va, vb = ev.pairs(self.a, b, self.metric)
            per[key] = stats.paired_difference(va, vb, relative=True)
        verdict = joint_verdict(equivalence_verdict(r["low"], r["high"], self.margin) for r in per.values())
        # show the comparison whose interval reaches furthest from zero: the one that decides equivalence
        worst = max(per.values(), key=lambda r: max(abs(r["low"]), abs(r["high"])))
        shown = {k: {x: r[x] for x in ("mean", "low", "high")} for k, r in per.items()}
        return claim_row(self.label, {**worst, "p": None}, verdict, runs, **{self.per_name: shown})


@dataclass(frozen=True)
class VarianceRatio:
    """Seed variance of ``a`` over that of ``b``: paired by seed (the two arms of a seed share its data order and
    initial weights, so they correlate: Pitman-Morgan, from 3 seeds), with Fisher's independent-samples F
    interval beside it (alone with 2 seeds). ``reproduced`` if the interval lies above 1.

    Attributes:
        a, b: the arms (numerator, denominator).
        label: the effect's description with ``{how}`` for the interval used.
        names: the details' names of the two variances.
    """

    a: Arm
    b: Arm
    label: str
    names: tuple[str, str] = ("var_a", "var_b")
    metric: str = PRIMARY

    def measure(self, ev: Evidence) -> tuple[list, list, list]:
        """``(seeds, values of a, values of b)`` on the arms' common seeds."""
        return ev.pairs(self.a, self.b, self.metric)

    def evaluate(self, ev: Evidence) -> dict:
        """The row of ``var(a) / var(b)``: with 3 or more paired seeds the Pitman-Morgan interval
        (:func:`~coupled_qk.study.stats.paired_variance_ratio`), else Fisher's F interval
        (:func:`~coupled_qk.study.stats.variance_ratio`), which the details always carry; ``reproduced`` if the
        interval lies above 1, ``contradicted`` if below.

        Raises:
            NotReady: a planned run missing, or fewer than ``ev.min_seeds`` paired seeds. ValueError: fewer than 2
                seeds or no spread (from the statistics).
        """
        ev.need(self.b, self.a)
        _, va, vb = self.measure(ev)
        f = stats.variance_ratio(va, vb)
        if len(va) >= 3:
            r = stats.paired_variance_ratio(va, vb)
            how, extra = "paired by seed, Pitman-Morgan interval", {"seed_correlation": r["r"]}
        else:
            r = {**f, "n": len(va)}
            how, extra = "F interval; a paired interval needs 3 seeds", {}
        verdict = "reproduced" if r["low"] > 1 else "contradicted" if r["high"] < 1 else NULL
        return claim_row(
            self.label.format(how=how),
            {"mean": r["ratio"], "low": r["low"], "high": r["high"], "n": r["n"], "p": r["p"]},
            verdict,
            ev.runs(*_cells(self.a, self.b)),
            **{self.names[0]: r["var_a"], self.names[1]: r["var_b"]},
            **extra,
            independent_f_interval={k: f[k] for k in ("low", "high", "p")},
        )


@dataclass(frozen=True)
class TokensToMatch:
    """Tokens ``reference`` needs to match ``target``'s final metric, over ``target``'s tokens, from the
    reference's *final* values at two budgets (``reference`` and ``reference_more``: separate runs, each with its
    own learning-rate schedule); its log is interpolated linearly in log(tokens) (:func:`stats.budget_to_match`).
    ``reproduced`` if the ratio's interval lies above 1. Intermediate points of the longer run's curve are not used
    for this: mid-schedule they sit at a higher learning rate than the shorter run's annealed end.

    Details: the wall-clock matched change (the reference trained for as long as the target took) and, when both
    ``target_more`` and ``reference_more`` exist, the same ratio from the loss curves of one schedule.
    """

    target: Arm
    reference: Arm
    reference_more: Arm
    target_more: Arm
    label: str
    metric: str = PRIMARY

    def evaluate(self, ev: Evidence) -> dict:
        """The row of the token ratio: per seed, the budget at which ``reference`` would match ``target``'s final
        metric (:func:`~coupled_qk.study.stats.budget_to_match`, log-linear between the 1x and 2x runs) over the
        target's tokens; the mean ratio's t interval (:func:`~coupled_qk.study.stats.mean_ci`), ``p`` of ratio 1,
        reproduced above 1. Seeds whose reference did not improve with budget are skipped.

        Raises:
            NotReady: a planned run missing, or fewer than ``ev.min_seeds`` seeds with a budget match.
        """
        ev.need(self.reference, self.target, self.reference_more)
        seeds = sorted(
            set(ev.values(self.target)) & set(ev.values(self.reference_more)) & set(ev.values(self.reference))
        )
        ratios, extrapolated, matched = [], 0, []
        for s in seeds:
            cou, std1, std2 = (ev.record(a, s) for a in (self.target, self.reference, self.reference_more))
            budgets = [std1["tokens"], std2["tokens"]]
            losses = [math.log(std1["final"][self.metric]), math.log(std2["final"][self.metric])]
            target = math.log(cou["final"][self.metric])
            match = stats.budget_to_match(budgets, losses, target)
            if match is None:  # the reference did not improve with more tokens: no finite budget
                continue
            ratios.append(match[0] / cou["tokens"])
            extrapolated += match[1]
            # wall-clock matched: the reference trained for as long as the target took (each run's own seconds)
            at = stats.loss_at_budget(budgets, losses, cou["tokens"] * cou["train_seconds"] / std1["train_seconds"])
            matched.append(100 * (math.exp(target - at) - 1))
        if len(ratios) < ev.min_seeds:
            raise NotReady(f"{len(ratios)} seeds with a budget match; at least {ev.min_seeds} needed")
        r = {**stats.mean_ci(ratios), "p": stats.mean_ci([x - 1 for x in ratios])["p"]}  # p of "ratio = 1"
        details = {
            "per_seed_ratio": ratios,
            "extrapolated_outside_1x_2x": extrapolated,
            "wallclock_matched_ppl_percent_coupled_vs_standard": stats.mean_ci(matched),
            "same_schedule_curves": self._same_schedule(ev),
            "note": "final held-out test perplexities of separate 1x and 2x runs, log-linear in tokens; "
            "wall-clock ratio from the runs' own training seconds on a shared machine",
        }
        verdict = direction_verdict(r["low"] - 1, r["high"] - 1, "positive")
        return claim_row(self.label, r, verdict, ev.runs(*_cells(self.reference, self.reference_more)), **details)

    def _same_schedule(self, ev: Evidence) -> dict | None:
        """Tokens the longer reference run needs to reach the validation loss the longer target run has at mid-run,
        over the target's mid-run tokens (``None`` without both; a run that never reaches it counts as
        ``2 / 1``, censored)."""
        seeds = sorted(set(ev.values(self.target_more)) & set(ev.values(self.reference_more)))
        ratios = []
        for s in seeds:
            cou, std = ev.record(self.target_more, s), ev.record(self.reference_more, s)
            mid = cou["tokens"] / 2
            target = stats.interpolate_at(cou["curve"]["valid"], mid)
            cross = stats.interpolate_crossing(std["curve"]["valid"], target) if target is not None else None
            ratios.append((cross if cross is not None else std["tokens"]) / mid)
        if len(ratios) < 2:
            return None
        return {**{k: v for k, v in stats.mean_ci(ratios).items() if k != "p"}, "per_seed_ratio": ratios}


@dataclass(frozen=True)
class ChangeDifference:
    """The difference of two paired changes, ``second - first`` (each ``b`` vs ``a`` in percent): per seed on the
    seeds both have when ``paired`` (the same seeds share data order and initial weights), else Welch's interval
    on the two sets of per-seed changes (e.g. two model sizes, or two studies: arms may name another study).

    Attributes:
        first, second: ``(a, b)`` arm pairs.
        expect: the claimed sign of the difference.
        paired: per-seed differences (``True``) or Welch (``False``).
    """

    first: tuple[Arm, Arm]
    second: tuple[Arm, Arm]
    label: str = ""
    expect: str = "positive"
    paired: bool = True

    def changes(self, ev: Evidence) -> tuple[dict, dict]:
        """``({seed: % change}, {seed: % change})`` of the two pairs."""
        out = []
        for a, b in (self.first, self.second):
            seeds, va, vb = ev.pairs(a, b)
            out.append(dict(zip(seeds, stats.paired_difference(va, vb, relative=True)["differences"])))
        return out[0], out[1]

    def difference(self, ev: Evidence) -> dict:
        """The statistic of ``second - first``: :func:`stats.mean_ci` of per-seed differences, or
        :func:`stats.welch_difference`."""
        one, two = self.changes(ev)
        if self.paired:
            common = sorted(set(one) & set(two))
            return stats.mean_ci([two[s] - one[s] for s in common])
        return stats.welch_difference(list(one.values()), list(two.values()))

    def evaluate(self, ev: Evidence) -> dict:
        """The row of ``second - first`` (:meth:`difference`: the t interval of per-seed differences when
        ``paired``, else Welch's interval) with :func:`direction_verdict` and ``expect``.

        Raises:
            NotReady: a planned run missing, or fewer than ``ev.min_seeds`` paired seeds in either pair.
        """
        ev.need(*self.first, *self.second)
        r = self.difference(ev)
        runs = ev.runs(*_cells(*self.first, *self.second))
        return claim_row(self.label, r, direction_verdict(r["low"], r["high"], self.expect), runs)


@dataclass(frozen=True)
class Narrows:
    """Two conditions of one claim: ``versus`` (a :class:`PairedChange`, whose numbers the row shows) and
    ``narrowing`` (a :class:`ChangeDifference`); the verdict is joint (:func:`joint_verdict`). ``beside``: a
    further paired change shown in the details when its runs exist (else ``"not run"``).

    Attributes:
        names: the details' names of ``(narrowing statistic, versus verdict, narrowing verdict, beside)``.
        need: what the claim waits for (cells or arms).
        cells: the cells whose runs the row's tokens and hours sum.
    """

    versus: PairedChange
    narrowing: ChangeDifference
    beside: tuple[Arm, Arm]
    names: tuple[str, str, str, str]
    need: tuple
    cells: tuple[str, ...]

    def evaluate(self, ev: Evidence) -> dict:
        """The row of ``versus`` (its paired percent change, t interval) with the joint verdict of ``versus`` and
        ``narrowing`` (:meth:`ChangeDifference.difference`); ``beside``'s paired change in the details, or
        ``"not run"``.

        Raises:
            NotReady: a run of ``need`` missing, or too few paired seeds for ``versus`` or ``narrowing``.
        """
        ev.need(*self.need)
        _, va, vb = self.versus.measure(ev)
        diff = stats.paired_difference(va, vb, relative=True)
        narrowing = self.narrowing.difference(ev)
        wins = direction_verdict(diff["low"], diff["high"], self.versus.expect)
        narrows = direction_verdict(narrowing["low"], narrowing["high"], self.narrowing.expect)
        details = {self.names[0]: narrowing, self.names[1]: wins, self.names[2]: narrows}
        try:
            _, a, b = ev.pairs(*self.beside)
            details[self.names[3]] = stats.paired_difference(a, b, relative=True)
        except NotReady:
            details[self.names[3]] = "not run"
        return claim_row(self.versus.label, diff, joint_verdict((wins, narrows)), ev.runs(*self.cells), **details)


@dataclass(frozen=True)
class ScoreGap:
    """``b`` minus ``a`` in a score (accuracy), per seed, taking each seed's best over the cells of one group (e.g.
    the learning rates of one MQAR difficulty); paired t interval per group. ``contradicted`` if a group's interval
    lies below zero, ``reproduced`` if every group's ``b`` reaches ``perfect`` in every seed and one group's interval
    lies above zero.

    Attributes:
        groups: ``{group: (cell, ...)}``; shown: the groups reported, the last one's numbers in the row.
        label: the effect's description with ``{shown}`` for that group.
    """

    a: str
    b: str
    groups: dict
    shown: tuple[str, ...]
    label: str
    metric: str = "valid/accuracy"
    perfect: float = 0.99

    def evaluate(self, ev: Evidence) -> dict:
        """The row of the score gap: per group, each seed's best ``metric`` over the group's cells, then the paired t
        interval of ``b - a`` (:func:`~coupled_qk.study.stats.paired_difference`); the verdict as the class
        docstring says, the row showing the last group of ``shown``.

        Raises:
            NotReady: no cells, a planned run missing, or none of the ``shown`` groups in this study.
        """
        cells = [c for cs in self.groups.values() for c in cs]
        if not cells:
            raise NotReady(f"protocol {ev.study!r} defines no MQAR cells")
        ev.need(*cells)
        best: dict = {}
        for group, members in self.groups.items():
            for (cell, v, s), r in ev.by_key.items():
                if cell in members:
                    acc = r["final"].get(self.metric, float("nan"))
                    cur = best.setdefault(group, {}).setdefault(v, {}).get(s, -1.0)
                    best[group][v][s] = max(cur, acc)
        shown = [g for g in self.shown if g in best]
        if not shown:
            raise NotReady(f"no {' or '.join(self.shown)} MQAR cell in this protocol")
        per = {}
        for g in shown:
            seeds = sorted(set(best.get(g, {}).get(self.a, {})) & set(best.get(g, {}).get(self.b, {})))
            per[g] = stats.paired_difference([best[g][self.a][s] for s in seeds], [best[g][self.b][s] for s in seeds])
            per[g]["coupled_min"] = min(best[g][self.b][s] for s in seeds)
        perfect = all(per[g]["coupled_min"] >= self.perfect for g in per)
        ahead = any(per[g]["low"] > 0 for g in per)
        verdict = (
            "contradicted" if any(per[g]["high"] < 0 for g in per) else "reproduced" if perfect and ahead else NULL
        )
        return claim_row(
            self.label.format(shown=shown[-1]),
            per[shown[-1]],
            verdict,
            ev.runs(*cells),
            per_difficulty={g: {k: r[k] for k in ("mean", "low", "high", "n", "coupled_min")} for g, r in per.items()},
            best_accuracy={g: {v: dict(sorted(x.items())) for v, x in by.items()} for g, by in best.items()},
        )


@dataclass(frozen=True)
class Correlation:
    """Correlation of ``x`` with ``y`` over the runs of the cells ``cells`` selects that share ``tokenizer_of``'s
    tokenizer (perplexities of different tokenizers are not comparable), each run once: pooled (Pearson with its
    Fisher interval, Spearman) and, under ``within_cell``, within cells
    (:func:`~coupled_qk.study.stats.within_group_correlation`), which cell-level differences cannot produce.
    ``None`` with fewer than 4 runs."""

    name: str
    x: str
    y: str
    prefixes: tuple[str, ...]
    tokenizer_of: str

    def points(self, ev: Evidence) -> list[tuple[str, str, float, float]]:
        """``(cell, variant, x, y)`` of the selected runs with both numbers."""
        from coupled_qk.study.records import metric_value

        ref = ev.plan.cell(self.tokenizer_of)
        if ref is None:
            return []
        tok = ref.base.get("tokenizer")
        points = []
        for (cell, variant, _), r in ev.by_key.items():
            planned = ev.plan.cell(cell)
            if r["config"].get("tokenizer") != tok or (planned is not None and planned.seeds_of):
                continue  # another tokenizer; or extra seeds, counted once under their base cell
            x, y = metric_value(r, self.x), metric_value(r, self.y)
            if cell.startswith(self.prefixes) and x is not None and y is not None:
                points.append((cell, variant, x, y))
        return points

    def evaluate(self, ev: Evidence) -> dict | None:
        """:func:`~coupled_qk.study.stats.correlation` of the :meth:`points` (Pearson with Fisher's z interval,
        Spearman) and, under ``"within_cell"``, :func:`~coupled_qk.study.stats.within_group_correlation` (``None``
        while some cell has too few runs). A details entry, not a claim row: ``None`` with fewer than 4 runs, never
        :class:`NotReady`."""
        points = self.points(ev)
        if len(points) < 4:
            return None
        cells, _, xs, ys = zip(*points)
        out = stats.correlation(xs, ys)
        try:
            out["within_cell"] = stats.within_group_correlation(xs, ys, cells)
        except ValueError:  # too few runs per cell yet
            out["within_cell"] = None
        return out


@dataclass(frozen=True)
class Claim:
    """A claim test bound to a study: its id, the claim and the paper's value in words, the test, and the paper's
    effect in the test's units (for "is the paper's value inside our interval").

    Attributes:
        extras: analyses a layout shows beside the row (e.g. :class:`~coupled_qk.study.report.TokensRatio`).
    """

    id: str
    text: str
    paper: str
    test: object
    paper_effect: float | None = None
    extras: tuple = ()

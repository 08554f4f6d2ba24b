"""The report of a converged design (:mod:`coupled_qk.experiments.claims.converged`), recomputed from its run
records alone, and its markdown, JSON and figure.

:func:`build_report` gives the grid, C1 (coupled vs standard), C3 (coupled vs the uncoupled MLP), C4 (seed
variance ratio, paired), C6 (coupled at 1x vs standard at 2.4x the tokens, and the tokens-to-equal-loss ratio
from the validation curves), Holm-adjusted p-values within the direction family, and for every paired test its
power to detect a true 1% effect; :func:`write_report` writes it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from coupled_qk.experiments.claims.converged import DESIGNS, Design, best_loss, plan, plateaued, units
from coupled_qk.experiments.claims.converged_fresh import fresh_note, fresh_records
from coupled_qk.experiments.claims.markdown import fmt as _fmt
from coupled_qk.experiments.claims.markdown import paper_in_ci
from coupled_qk.experiments.claims.records import read_record_file
from coupled_qk.experiments.claims.rules import PAPER_EFFECTS
from coupled_qk.io import write_text_atomic
from coupled_qk.study import stats
from coupled_qk.study.power import detectable_effect, power_two_sided, variance_ratio_power

PRIMARY = "test/perplexity"
EQUIVALENCE_MARGIN = 1.0  # percent, as the first-epoch claims report
POWER_EFFECT = 1.0  # percent: the effect size every power statement refers to (but C4's)
PAPER_C4 = 8.0  # the paper's seed-variance ratio, uncoupled MLP / coupled: C4's power refers to it


def load_records(out_dir: str | Path, design: Design, damaged: str = "raise") -> dict:
    """``{(cell, variant, seed): record}`` of the finished runs of ``design`` under ``out_dir/runs``; a damaged
    (unreadable, not JSON) record is an error, or with ``damaged="skip"`` (the study's planner, which trains
    that run again) left out.

    Raises:
        ValueError: naming the file, for one that is damaged (not readable, not JSON) or parses but is not a run
            record (:func:`~coupled_qk.experiments.claims.records.read_record_file`).
    """
    out = {}
    for path in sorted((Path(out_dir) / "runs" / design.name).glob("*/*/seed*.json")):
        rec = read_record_file(path, damaged=damaged)
        if rec is not None:
            out[(rec["cell"], rec["variant"], rec["seed"])] = rec
    return out


def _power(sd: float, n: int, effect: float = POWER_EFFECT) -> dict:
    """Power of a two-sided paired t-test (alpha 0.05) to detect a true mean ``effect`` given the per-pair
    ``sd``, and the effect detectable with 80% power (:mod:`~coupled_qk.study.power`)."""
    if n < 2 or not (sd > 0 and math.isfinite(sd)):
        return {"power": math.nan, "mde80": math.nan}
    se = sd / math.sqrt(n)
    # beyond scipy's accurate noncentral-t range the power is 1 to many digits
    return {"power": 1.0 if effect / se > 40 else power_two_sided(effect, se, n), "mde80": detectable_effect(se, n)}


def _ratio_power(r: float, n: int) -> dict:
    """C4's power: for the paper's variance ratio at the observed pair correlation ``r``, and the ratio (> 1)
    detectable with 80% power (:func:`~coupled_qk.study.power.variance_ratio_power`)."""
    if n < 4 or not -1 < r < 1:
        return {"power": math.nan, "mde80": math.nan}
    lo, hi = 0.0, math.log(1e4)  # bisection on log(ratio)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if variance_ratio_power(math.exp(mid), r, n) < 0.8 else (lo, mid)
    return {"power": variance_ratio_power(PAPER_C4, r, n), "mde80": math.exp(hi)}


def _pairs(records: dict, a: tuple[str, str], b: tuple[str, str], metric: str = PRIMARY):
    seeds = sorted({s for (c, v, s) in records if (c, v) == a} & {s for (c, v, s) in records if (c, v) == b})
    va = [records[(*a, s)]["final"][metric] for s in seeds]
    vb = [records[(*b, s)]["final"][metric] for s in seeds]
    return seeds, va, vb


def _direction(low: float, high: float) -> str:
    if not (math.isfinite(low) and math.isfinite(high)):
        return "not enough seeds"
    return (
        "coupled better (excluded zero)"
        if high < 0
        else "coupled worse (excluded zero)"
        if low > 0
        else "inconclusive (interval includes zero)"
    )


def _paired_row(claim: str, label: str, records: dict, a, b, expected_n: int) -> dict:
    seeds, va, vb = _pairs(records, a, b)
    row = {"claim": claim, "effect": label, "n": len(seeds), "expected_n": expected_n, "seeds": seeds}
    if len(seeds) < 2:
        return {**row, "status": f"running ({len(seeds)} of {expected_n} pairs)"}
    r = stats.paired_difference(va, vb, relative=True)
    row.update(
        mean=r["mean"],
        low=r["low"],
        high=r["high"],
        p=r["p"],
        sd=r["sd"],
        per_seed=r["differences"],
        a_ppl=stats.mean_ci(va)["mean"],
        b_ppl=stats.mean_ci(vb)["mean"],
        **_power(r["sd"], len(seeds)),
    )
    row["status"] = "complete" if len(seeds) >= expected_n else f"running ({len(seeds)} of {expected_n} pairs)"
    return row


def _curve_mean(recs: list[dict]) -> dict:
    """Validation loss against tokens: mean, min and max over runs at the evaluation points they share."""
    curves = [dict((int(t), loss) for t, loss in r["curve"]["valid"]) for r in recs]
    if not curves:
        return {}
    common = sorted(set.intersection(*(set(c) for c in curves)))
    rows = [[c[t] for c in curves] for t in common]
    return {
        "tokens": common,
        "mean": [sum(x) / len(x) for x in rows],
        "low": [min(x) for x in rows],
        "high": [max(x) for x in rows],
        "n": len(curves),
    }


def _tokens_to_match(std_rec: dict, coupled_rec: dict) -> float | None:
    """Tokens the standard run's validation curve needs to first reach coupled's best validation loss, divided
    by the tokens at coupled's best (``None`` if standard never reaches it)."""
    target = best_loss(coupled_rec)
    reach = stats.interpolate_crossing([(t, loss) for t, loss in std_rec["curve"]["valid"]], target)
    at = (coupled_rec.get("best") or {}).get("tokens") or coupled_rec["tokens"]
    return None if reach is None else reach / at


def build_report(design: Design, out_dir: str | Path) -> dict:
    """The report of ``design`` recomputed from its records alone (JSON-serialisable)."""
    records = load_records(out_dir, design)
    p = plan(design, records)
    standard, coupled = design.variants[:2]
    name = design.name
    main, matched = f"{name}-main", f"{name}-matched"
    grid = {v: {str(lr): loss for lr, loss in sorted(p.grid[v].items())} for v in design.variants}
    runs = []
    for (cell, variant, seed), rec in sorted(records.items()):
        runs.append(
            {
                "cell": cell,
                "variant": variant,
                "seed": seed,
                "lr": rec["config"].get("lr"),
                "epochs": rec.get("epochs"),
                "best_epoch": (rec.get("best") or {}).get("epoch"),
                "stop_reason": rec.get("stop_reason"),
                "plateaued": plateaued(rec),
                "best_valid_loss": best_loss(rec),
                "test_ppl": rec["final"].get(PRIMARY),
                "train_hours": rec.get("train_seconds", 0) / 3600,
            }
        )
    conv = fresh_records(records, (f"{name}-fresh", standard), (main, coupled)) if design.fresh_seeds else {}
    claims = [*_direction_rows(design, records), *_matched_rows(design, records), *_fresh_rows(design, records, conv)]
    curves = {
        f"{standard}": _curve_mean([records[k] for k in records if k[:2] == (main, standard)]),
        f"{coupled}": _curve_mean([records[k] for k in records if k[:2] == (main, coupled)]),
    }
    if len(design.variants) > 2:
        unc = design.variants[2]
        curves[unc] = _curve_mean([records[k] for k in records if k[:2] == (f"{name}-uncoupled", unc)])
    if design.matched_seeds:
        curves[f"{standard} {design.matched_factor}x"] = _curve_mean(
            [records[k] for k in records if k[:2] == (matched, standard)]
        )
    if design.fresh_seeds:
        curves[f"{standard} {design.matched_factor}x data"] = _curve_mean(
            [conv[k] for k in conv if k[:2] == (f"{name}-fresh", standard)]
        )
    progress = {}
    for stage, cell, variant, seed in units(p):
        done = (cell.name, variant, seed) in records
        d, t = progress.get(stage, (0, 0))
        progress[stage] = (d + done, t + 1)
    for row in claims:  # the paper's value, where it is in the row's units (C6 rows are read as equivalence)
        if row["claim"] in PAPER_EFFECTS and row["claim"] != "C6" and "low" in row:
            row["paper_effect"] = PAPER_EFFECTS[row["claim"]]
            row["paper_effect_in_ci"] = row["low"] <= row["paper_effect"] <= row["high"]
    # the wiki-vital and PubMed CPU designs sit beside the first-epoch `cpu` protocol (same preset and corpora)
    first = _first_epoch_rows(Path(out_dir) / "cpu.json") if design.name.startswith("cpu-converged") else {}
    for row in claims:
        if row["claim"] in first:
            row["first_epoch"] = first[row["claim"]]
    return {
        "design": design.name,
        "description": design.description,
        "main_claim": design.main_claim,
        "notes": list(design.notes),
        "chosen_lr": {v: lr for v, lr in p.chosen_lr.items()},
        "epochs": p.epochs,
        "grid": grid,
        "waiting": p.waiting,
        "claims": claims,
        "runs": runs,
        "curves": curves,
        "progress": {k: {"done": d, "planned": t} for k, (d, t) in progress.items()},
    }


def _direction_rows(design: Design, records: dict) -> list[dict]:
    """The main claim (C1, or C9 on PubMed: coupled vs standard) and, with an uncoupled stage, C3 (coupled vs the
    uncoupled MLP, Holm-adjusted with it) and C4 (seed variance ratio, paired, Pitman-Morgan)."""
    standard, coupled = design.variants[:2]
    main, unc = f"{design.name}-main", f"{design.name}-uncoupled"
    rows = [
        _paired_row(
            design.main_claim,
            "test ppl, coupled vs standard, % (paired by seed: data order and shared initial weights)",
            records,
            (main, standard),
            (main, coupled),
            len(design.seeds),
        )
    ]
    if len(design.variants) > 2:
        rows.append(
            _paired_row(
                "C3",
                "test ppl, coupled vs uncoupled MLP, % (paired by seed)",
                records,
                (unc, design.variants[2]),
                (main, coupled),
                len(design.seeds),
            )
        )
    ps = [r["p"] for r in rows if "p" in r]
    adjusted = iter(stats.holm(ps)) if ps else iter(())
    for r in rows:
        if "p" in r:
            r["p_holm"] = next(adjusted)
            r["verdict"] = _direction(r["low"], r["high"])
    if len(design.variants) < 3:
        return rows
    seeds, vu, vc = _pairs(records, (unc, design.variants[2]), (main, coupled))
    c4 = {
        "claim": "C4",
        "effect": f"seed variance of test ppl, uncoupled MLP / coupled (paired, Pitman-Morgan; "
        f"power for the paper's {PAPER_C4:g}x at the observed correlation, detectable ratio at 80%)",
        "n": len(seeds),
        "expected_n": len(design.seeds),
    }
    if len(seeds) >= 3:
        r = stats.paired_variance_ratio(vu, vc)
        c4.update(
            mean=r["ratio"],
            low=r["low"],
            high=r["high"],
            p=r["p"],
            r=r["r"],
            **_ratio_power(r["r"], len(seeds)),
            verdict="uncoupled more variable (excluded 1)"
            if r["low"] > 1
            else "coupled more variable (excluded 1)"
            if r["high"] < 1
            else "inconclusive (interval includes 1)",
        )
    c4["status"] = "complete" if len(seeds) >= len(design.seeds) else f"running ({len(seeds)} of {len(design.seeds)})"
    return [*rows, c4]


def _c6_row(
    claim: str, label: str, records: dict, arm: tuple[str, str], ref: tuple[str, str], expected_n: int, equivalent: str
) -> dict:
    """A C6-style row: test ppl of ``ref`` (coupled at 1x) vs ``arm`` (standard with more tokens), paired by seed,
    read as equivalence within +-``EQUIVALENCE_MARGIN``% (verdict ``equivalent``) or a direction, plus the
    tokens-to-equal-loss ratio of each pair (:func:`_tokens_to_match`)."""
    row = _paired_row(
        claim,
        f"{label}, % (equivalent if the interval is inside +-{EQUIVALENCE_MARGIN}%)",
        records,
        arm,
        ref,
        expected_n,
    )
    if "low" in row:
        inside = -EQUIVALENCE_MARGIN < row["low"] and row["high"] < EQUIVALENCE_MARGIN
        row["verdict"] = equivalent if inside else _direction(row["low"], row["high"])
    ratios = [_tokens_to_match(records[(*arm, s)], records[(*ref, s)]) for s in row["seeds"]]
    reached = [x for x in ratios if x is not None]
    row["tokens_ratio"] = {
        "per_seed": ratios,
        "never_reached": len(ratios) - len(reached),
        **(stats.mean_ci(reached) if len(reached) >= 2 else {}),
    }
    return row


def _matched_rows(design: Design, records: dict) -> list[dict]:
    """C6 against the compute-matched arm (standard at ``matched_factor`` x the tokens of the same text), its
    regime check and tokens-to-equal-loss ratio; ``[]`` without a matched stage."""
    if not design.matched_seeds:
        return []
    standard, coupled = design.variants[:2]
    main, matched = f"{design.name}-main", f"{design.name}-matched"
    f = design.matched_factor
    c6 = _c6_row(
        "C6",
        f"test ppl, coupled (1x) vs standard ({f}x tokens)",
        records,
        (matched, standard),
        (main, coupled),
        len(design.matched_seeds),
        f"equivalent (coupled at 1x matches standard at {f}x)",
    )
    both = [s for s in design.matched_seeds if (matched, standard, s) in records and (main, standard, s) in records]
    c6["regime_check"] = matched_regime(
        [records[(matched, standard, s)] for s in both], [records[(main, standard, s)] for s in both], f
    )
    if c6["regime_check"].get("overfit") and "verdict" in c6:
        c6["verdict"] += f"; the {f}x arm overfits (see the note): not a sample-efficiency test"
    return [c6]


def _fresh_rows(design: Design, records: dict, conv: dict) -> list[dict]:
    """The ``C6-fresh`` row (coupled at 1x vs standard on ``matched_factor`` x the training documents), read from
    ``conv``, the records with the fresh arm per 1x-tokenizer token
    (:func:`~coupled_qk.experiments.claims.converged_fresh.fresh_records`); ``[]`` without that stage."""
    if not design.fresh_seeds:
        return []
    standard, coupled = design.variants[:2]
    main, fresh, f = f"{design.name}-main", f"{design.name}-fresh", design.matched_factor
    row = _c6_row(
        "C6-fresh",
        f"test ppl, coupled (1x) vs standard ({f}x training articles, {f}x tokens; per 1x-tokenizer token)",
        conv,
        (fresh, standard),
        (main, coupled),
        len(design.fresh_seeds),
        f"equivalent (coupled at 1x matches standard with {f}x data)",
    )
    runs = [conv[(fresh, standard, s)] for s in row["seeds"]]
    main_std = [records[(main, standard, s)] for s in row["seeds"] if (main, standard, s) in records]
    row["regime_check"] = {"n": len(runs), "note": fresh_note(runs, main_std, f)}
    return [row]


def matched_regime(matched: list[dict], main: list[dict], factor: float) -> dict:
    """Does the compute-matched arm (standard at ``factor`` x the tokens) measure what C6 asks?

    With a fixed corpus, ``factor`` x the tokens is ``factor`` x the epochs over the same text under a
    ``factor`` x longer learning-rate schedule; if those runs reach a *worse* best validation loss than the
    same seeds' 1x runs (``main``, paired by position), the long arm overfits before its rate decays and a
    comparison against it is not a sample-efficiency test (the paper's C6 adds fresh data). Returns
    ``{"n", "matched_best", "main_best", "overfit", "note"}`` (means of the best validation losses; ``overfit`` when
    the matched mean is higher), or ``{"n": 0}`` without pairs.
    """
    if not matched:
        return {"n": 0}
    a = sum(best_loss(r) for r in matched) / len(matched)
    b = sum(best_loss(r) for r in main) / len(main)
    epochs = [r.get("epochs") for r in matched if r.get("epochs")]
    stops = sorted({r.get("stop_reason") for r in matched})
    overfit = a > b
    note = (
        f"Regime check of C6 ({len(matched)} seeds): standard at {factor}x the tokens reached a best validation "
        f"loss of {a:.4f} against {b:.4f} at 1x (same seeds), stopping at "
        f"{min(epochs, default=0):.1f}-{max(epochs, default=0):.1f} epochs ({', '.join(map(str, stops))}). "
    )
    note += (
        "With a fixed corpus, more tokens are more epochs of the same text under a longer learning-rate "
        "schedule, and this arm overfits before its rate decays: C6's comparison here is against an overfit "
        "arm, not a test of sample efficiency (the paper's C6 has fresh data; a fair version needs a corpus "
        f"{factor}x larger or the same schedule)."
        if overfit
        else "The longer arm is at least as good as 1x, so the comparison is a fair compute match."
    )
    return {"n": len(matched), "matched_best": a, "main_best": b, "overfit": overfit, "note": note}


def _first_epoch_rows(path: Path) -> dict:
    """C1, C3, C4, C6 and C9 of the first-epoch ``cpu`` protocol's report (``cpu.json`` beside this report), to show
    the two regimes side by side; ``{}`` if that report is absent."""
    try:
        rows = json.loads(path.read_text())["rows"]
    except (OSError, ValueError, KeyError):
        return {}
    keep = ("mean", "low", "high", "n", "verdict")
    return {r["id"]: {k: r.get(k) for k in keep} for r in rows if r.get("id") in ("C1", "C3", "C4", "C6", "C9")}


def _ratio(x) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.2f}x"


def _pct(x) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.2f}%"


def format_markdown(report: dict, command: str) -> str:
    """The report as markdown (tables of claims, grid, runs; notes)."""
    lines = [
        f"# Converged study `{report['design']}`",
        "",
        report["description"] + ".",
        "",
        f"Regenerate: `{command}` (every number below is recomputed from the run records).",
        "",
        "## Progress",
        "",
    ]
    for stage, c in report["progress"].items():
        lines.append(f"- {stage}: {c['done']} of {c['planned']} planned runs finished")
    lines += [f"- {w}" for w in report["waiting"]]
    if report["chosen_lr"]:
        lines += [
            "",
            "Chosen learning rates (grid, reserve seed): "
            + ", ".join(f"{v} {lr:g}" for v, lr in report["chosen_lr"].items())
            + f"; horizon {report['epochs']:g} epochs.",
        ]
    lines += [
        "",
        "## Claims",
        "",
        "| claim | effect | mean | 95% interval | n | p (Holm) | power for 1% (C4: 8x) | "
        "detectable at 80% | paper's value inside? | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["claims"]:
        if "low" not in r:
            lines.append(f"| {r['claim']} | {r['effect']} | - | - | {r['n']} | - | - | - | - | {r['status']} |")
            continue
        p = _fmt(r.get("p_holm", r.get("p")), 3)
        lines.append(
            f"| {r['claim']} | {r['effect']} | {_fmt(r['mean'])} | [{_fmt(r['low'])}, {_fmt(r['high'])}] | "
            f"{r['n']} | {p} | {_fmt(r.get('power'))} | "
            f"{_ratio(r.get('mde80')) if r['claim'] == 'C4' else _pct(r.get('mde80'))} | {paper_in_ci(r)} | "
            f"{r.get('verdict', '')} ({r['status']}) |"
        )
    first = [r for r in report["claims"] if r.get("first_epoch")]
    if first:
        lines += [
            "",
            "The same claims in the first-epoch `cpu` protocol (one learning rate for every variant, runs "
            "stopped inside the first epoch, last iterate; [cpu.md](cpu.md)):",
            "",
            "| claim | mean | 95% interval | n | verdict there |",
            "|---|---|---|---|---|",
        ]
        for r in first:
            f = r["first_epoch"]
            lines.append(
                f"| {r['claim']} | {_fmt(f['mean'])} | [{_fmt(f['low'])}, {_fmt(f['high'])}] | {f['n']} | "
                f"{f['verdict']} |"
            )
    for c6 in (r for r in report["claims"] if r["claim"] in ("C6", "C6-fresh")):
        tr = c6["tokens_ratio"]
        if tr["per_seed"]:
            lines += [
                "",
                f"{c6['claim']}, tokens standard's validation curve needs to reach coupled's best "
                "validation loss, as a multiple of coupled's tokens at its best: per seed "
                + ", ".join(_fmt(x) for x in tr["per_seed"])
                + (f"; mean {_fmt(tr['mean'])} [{_fmt(tr['low'])}, {_fmt(tr['high'])}]" if "mean" in tr else ""),
            ]
        if c6.get("regime_check", {}).get("n"):
            lines += ["", c6["regime_check"]["note"]]
    lines += [
        "",
        "## Learning-rate grid (best validation loss, reserve seed)",
        "",
        "| variant | " + " | ".join(sorted({lr for g in report["grid"].values() for lr in g}, key=float)) + " |",
    ]
    lrs = sorted({lr for g in report["grid"].values() for lr in g}, key=float)
    lines.append("|---|" + "---|" * len(lrs))
    for v, g in report["grid"].items():
        lines.append(f"| {v} | " + " | ".join(_fmt(g.get(lr), 4) for lr in lrs) + " |")
    lines += [
        "",
        "## Runs",
        "",
        "| cell | variant | seed | lr | epochs | best at epoch | stop | plateaued | "
        "best valid loss | test ppl | hours |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        lines.append(
            f"| {r['cell']} | {r['variant']} | {r['seed']} | {r['lr']:g} | {_fmt(r['epochs'])} | "
            f"{_fmt(r['best_epoch'])} | {r['stop_reason']} | {'yes' if r['plateaued'] else 'no'} | "
            f"{_fmt(r['best_valid_loss'], 4)} | {_fmt(r['test_ppl'])} | {_fmt(r['train_hours'])} |"
        )
    lines += ["", "## Notes", ""] + [f"- {n}" for n in report["notes"]]
    return "\n".join(lines) + "\n"


def write_report(report: dict, out_dir: str | Path, command: str, figures: bool = True) -> list[Path]:
    """Write ``<out_dir>/<design>.json``, ``.md``, ``-readme.md`` (the README's headline,
    :func:`~coupled_qk.experiments.claims.headline.converged_headline`) and (with ``figures``)
    ``figures/<design>-valid.png``."""
    from coupled_qk.experiments.claims.headline import converged_headline

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = report["design"]
    paths = [out_dir / f"{name}.json", out_dir / f"{name}.md", out_dir / f"{name}-readme.md"]
    write_text_atomic(paths[0], json.dumps(report, indent=1, default=str) + "\n")
    write_text_atomic(paths[1], format_markdown(report, command))
    tokens = DESIGNS[name].train_tokens if name in DESIGNS else None
    write_text_atomic(paths[2], converged_headline(report, tokens) + "\n")
    if figures and any(report["curves"].values()):
        paths.append(_figure(report, out_dir / "figures" / f"{report['design']}-valid.png"))
    return paths


def _figure(report: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, c in report["curves"].items():
        if not c:
            continue
        (line,) = ax.plot(c["tokens"], c["mean"], label=f"{label} (n={c['n']})")
        ax.fill_between(c["tokens"], c["low"], c["high"], color=line.get_color(), alpha=0.2)
    ax.set_xlabel("training tokens")
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title(f"{report['design']}: validation loss, mean and min-max band over seeds")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

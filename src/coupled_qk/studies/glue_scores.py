"""Claim C11 of the first-epoch studies: GLUE fine-tuning scores read from ``coupled-qk glue``'s ``results.json``,
and the claim test :class:`GlueNoBenefit`.

The claim (docs/METHOD.md section 3, C11) is a null claim: coupling brings no benefit on GLUE. A comparison
in which no model learns the task (every score at the majority-class level) cannot tell a benefit from none,
so :func:`informative_tasks` keeps only the tasks where the baseline beats the majority class.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PRIMARY = {"sst2": "accuracy", "cola": "mcc", "rte": "accuracy", "mrpc": "f1"}
"""The GLUE dev metric each task is judged by (its standard metric; MRPC also reports accuracy)."""

MIN_MARGIN = 0.02
"""Baseline score above the majority class (absolute) for a task to count as learned."""


def glue_score_rows(data) -> list[dict]:
    """``[{"task", "variant", "seed", "score"}]`` from ``coupled-qk glue``'s ``results.json`` (schema
    ``coupled-qk/glue-results/v1``: score = the task's :data:`PRIMARY` dev metric), or from a JSON list of such
    rows (or ``{"runs": rows}``) as given.

    Raises:
        ValueError: a results file of another schema, or a run without its task's primary metric.
    """
    if isinstance(data, dict) and "schema" in data:
        if data["schema"] != "coupled-qk/glue-results/v1":
            raise ValueError(f"GLUE results schema {data['schema']!r} is unknown; expected coupled-qk/glue-results/v1")
        rows = []
        for variant, model in data["models"].items():
            for task, result in model["tasks"].items():
                for run in result["runs"]:
                    if PRIMARY[task] not in run["dev"]:
                        raise ValueError(f"GLUE run {run.get('run_dir')} has no dev {PRIMARY[task]!r}")
                    rows.append(
                        {
                            "task": task,
                            "variant": variant,
                            "seed": run["seed"],
                            "score": float(run["dev"][PRIMARY[task]]),
                        }
                    )
        return rows
    return data.get("runs", data) if isinstance(data, dict) else data


ROW_KEYS = ("task", "variant", "seed", "score")


def load_glue_rows(option: str, path: str | Path) -> list[dict]:
    """The score rows of a GLUE results file (:func:`glue_score_rows`), each checked: a dict with ``task``,
    ``variant`` (text), ``seed`` (an int) and a finite ``score``.

    Raises:
        FileNotFoundError / ValueError: naming ``option`` and the file: missing, a folder, not UTF-8, not JSON,
            another schema, or a malformed row.
    """
    from coupled_qk.checks.paths import input_file

    file = input_file(option, path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{option}={str(path)!r} is not a UTF-8 text file") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{option}={str(path)!r} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    try:
        rows = glue_score_rows(data)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(
            f"{option}={str(path)!r} is not a coupled-qk glue results.json ({exc!r} missing or malformed)"
        ) from None
    except ValueError as exc:
        raise ValueError(f"{option}={str(path)!r}: {exc}") from None
    if not isinstance(rows, list):
        raise ValueError(
            f"{option}={str(path)!r}: expected glue's results.json or a JSON list of rows with {', '.join(ROW_KEYS)}"
        )
    for i, row in enumerate(rows):
        ok = isinstance(row, dict) and all(k in row for k in ROW_KEYS)
        ok = ok and isinstance(row["task"], str) and isinstance(row["variant"], str)
        ok = ok and isinstance(row["seed"], int) and not isinstance(row["seed"], bool)
        ok = (
            ok
            and isinstance(row["score"], (int, float))
            and not isinstance(row["score"], bool)
            and math.isfinite(row["score"])
        )
        if not ok:
            raise ValueError(
                f"{option}={str(path)!r}: row {i} {row!r} must hold task and variant (text), seed (an "
                "integer) and a finite score"
            )
    return rows


def majority_score(task: str, data_dir=None) -> float | None:
    """The task's primary dev metric for always predicting the most frequent dev label (``None`` when the GLUE
    data or scikit-learn is not available)."""
    try:
        from coupled_qk.data.glue import glue_metrics, load_glue

        labels = load_glue(task, "dev", data_dir).labels
        return glue_metrics(task, labels, np.full_like(labels, np.bincount(labels).argmax()))[PRIMARY[task]]
    except (OSError, ValueError, ImportError):
        return None


def informative_tasks(rows: list[dict], baseline: str = "standard", data_dir=None) -> dict[str, float | None]:
    """``{task: majority score}`` for the tasks whose ``baseline`` mean score beats the majority class by at
    least :data:`MIN_MARGIN` (tasks whose majority score cannot be computed are kept)."""
    out = {}
    for task in sorted({r["task"] for r in rows}):
        scores = [r["score"] for r in rows if r["task"] == task and r["variant"] == baseline]
        floor = majority_score(task, data_dir)
        if scores and (floor is None or float(np.mean(scores)) >= floor + MIN_MARGIN):
            out[task] = floor
    return out


@dataclass(frozen=True)
class GlueNoBenefit:
    """C11 from the GLUE study's results (``--glue-json``: ``coupled-qk glue``'s ``results.json``, or a JSON list of
    ``{"task", "variant", "seed", "score"}`` rows), paired by seed per task. Only tasks the baseline learned (beats
    the majority class) can show a benefit or its absence; with none the comparison is uninformative.
    ``contradicted`` when a task gains significantly after Holm's adjustment over the tasks, ``reproduced`` when on
    every learned task the gain's upper bound stays below ``margin``."""

    margin: float = 0.01
    a: str = "standard"
    b: str = "coupled"
    inputs = ("glue_json",)

    def evaluate(self, ev) -> dict:
        """C11's row from ``ev.inputs["glue_json"]``: per task, the paired t interval of ``b - a`` over the seeds
        both have (:func:`~coupled_qk.study.stats.paired_difference`, at least 2), Holm-adjusted p-values over the
        tasks (:func:`~coupled_qk.study.stats.holm`); the row shows the learned task with the largest mean gain and
        the smallest adjusted p.

        Raises:
            NotReady: no results file, or no task with paired seeds of both variants. ValueError: a malformed file
                (:func:`load_glue_rows`).
        """
        from coupled_qk.study import stats
        from coupled_qk.study.claims import NotReady, claim_row

        glue_json = ev.inputs.get("glue_json")
        path = Path(glue_json) if glue_json else None
        if path is None or not path.is_file():
            raise NotReady(f"waiting for the GLUE fine-tuning results: expected {path or '--glue-json FILE'}")
        rows = load_glue_rows("--glue-json", path)
        by: dict = {}
        for r in rows:
            by.setdefault(r["task"], {}).setdefault(r["variant"], {})[r["seed"]] = float(r["score"])
        per, pvals = {}, []
        for task, v in sorted(by.items()):
            seeds = sorted(set(v.get(self.a, {})) & set(v.get(self.b, {})))
            if len(seeds) >= 2:
                per[task] = stats.paired_difference([v[self.a][s] for s in seeds], [v[self.b][s] for s in seeds])
                pvals.append(per[task]["p"])
        if not per:
            raise NotReady(f"{path} holds no task with paired standard/coupled seeds")
        adj = stats.holm(pvals)
        better = [t for (t, r), p in zip(per.items(), adj) if r["mean"] > 0 and p <= 0.05]
        learned = sorted(set(informative_tasks(rows)) & set(per))
        # "no benefit": on every task the baseline learned, the gain's upper bound stays below the margin
        no_gain = bool(learned) and all(per[t]["high"] <= self.margin for t in learned)
        verdict = "contradicted" if better else "reproduced" if no_gain else "not reproduced at this scale"
        shown = max(learned or per, key=lambda t: per[t]["mean"])
        # the row's p: the smallest Holm-adjusted p over the tasks (any task differs), not the shown task's own p
        return claim_row(
            f"GLUE dev score, coupled - standard ({shown}: the {'learned ' if learned else ''}task with the "
            f"largest mean difference; no benefit if every learned task's CI is below +{self.margin})",
            {**per[shown], "p": min(adj)},
            verdict,
            [],
            significant_gain_tasks=better,
            learned_tasks=learned,
            uninformative=""
            if learned
            else "no task where the standard model beats the majority class: the comparison cannot show a benefit",
            per_task={t: {k: r[k] for k in ("mean", "low", "high", "n")} for t, r in per.items()},
            task_holm_p=dict(zip(per, adj)),
        )

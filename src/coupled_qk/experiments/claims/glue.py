"""C11 input: GLUE fine-tuning scores for the claims report, read from ``coupled-qk glue``'s ``results.json``.

The claim (docs/METHOD.md section 3, C11) is a null claim: coupling brings no benefit on GLUE. A comparison
in which no model learns the task (every score at the majority-class level) cannot tell a benefit from none,
so :func:`informative_tasks` keeps only the tasks where the baseline beats the majority class.
"""

from __future__ import annotations

import json
import math
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
    from coupled_qk.outputs import input_file

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

"""C6 with fresh data: coupled at 1x against standard trained on 2.4x the training documents (issue 25).

The ``fresh`` stage of a converged design (:func:`coupled_qk.experiments.claims.converged.fresh_cell`) trains
standard on a larger training split with its *own* BPE tokenizer, so its per-token losses count other tokens
than the 1x runs'. Both arms are scored on the same validation and test text, so the comparison uses that
text's total log-likelihood (nats), which does not depend on the tokenizer: :func:`to_reference` rewrites a
fresh record in the units of a 1x record (its tokenizer's token counts), after which every 1x analysis applies
unchanged (the paired relative difference of test perplexity, the tokens-to-equal-loss ratio, the curves).
A relative difference of these perplexities is a monotone transform of the difference in bits per byte.
"""

from __future__ import annotations

import copy
import math

from coupled_qk.experiments.claims.converged import best_loss


def _name(rec) -> str:
    """``cell/variant/seed<k>`` of a record, for messages."""
    if not isinstance(rec, dict):
        return f"{rec!r}"[:60]
    return f"{rec.get('cell')}/{rec.get('variant')}/seed{rec.get('seed')}"


def _final(rec) -> dict:
    final = rec.get("final") if isinstance(rec, dict) else None
    if not isinstance(final, dict):
        raise ValueError(f"record {_name(rec)} has no 'final' metrics (a dict); expected a run record")
    return final


def _number(rec, where: str, value) -> float:
    """``value`` if it is a finite real number (not a bool); ``ValueError`` naming the record and ``where``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"record {_name(rec)}: {where}={value!r}; expected a finite number")
    return float(value)


def _metric(rec, key: str) -> float:
    final = _final(rec)
    if key not in final:
        raise ValueError(f"record {_name(rec)} has no final[{key!r}] (needed to compare across tokenizers)")
    return _number(rec, f"final[{key!r}]", final[key])


def _count(rec, key: str) -> int:
    """A positive whole count of ``final`` (``valid/n_tokens``, ``test/n_bytes``, ...)."""
    n = _final(rec).get(key)
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not math.isfinite(n) or n < 1 or n != int(n):
        raise ValueError(
            f"record {_name(rec)}: final[{key!r}]={n!r}; expected a positive whole number (needed to "
            "compare across tokenizers)"
        )
    return int(n)


def to_reference(rec: dict, ref: dict) -> dict:
    """A copy of ``rec`` expressed per token of ``ref``'s tokenizer (same validation and test text).

    Losses (nats per token) are scaled by ``n_own / n_ref`` (the split's token counts: the same total nats
    spread over the reference's tokens); test perplexity becomes ``exp(test nll / n_ref)``; token positions
    (curve x-values, the best checkpoint's tokens, the run's tokens) are scaled by ``n_ref / n_own`` of the
    validation split (tokens of the reference tokenizer holding the same text). ``final`` keeps the run's own
    values under ``own/...``.

    Args:
        rec: a run record (``final`` with ``valid/n_tokens``, ``test/n_tokens``, ``test/nll``; ``curve``;
            ``best``).
        ref: a record of the reference tokenizer on the same split (e.g. the same seed's coupled 1x run).

    Raises:
        ValueError: naming the record and field: a record lacks a field used here or holds one of the wrong
            kind (token and byte counts must be positive whole numbers, losses and positions finite numbers),
            or the validation/test text differs (byte counts disagree).
    """
    if any(_count(rec, f"{s}/n_bytes") != _count(ref, f"{s}/n_bytes") for s in ("valid", "test")):
        raise ValueError(
            "records scored different validation/test text (n_bytes differ): cannot compare "
            f"{rec.get('cell')} with {ref.get('cell')} across tokenizers"
        )
    v_scale = _count(rec, "valid/n_tokens") / _count(ref, "valid/n_tokens")
    t_ref = _count(ref, "test/n_tokens")
    valid_loss, test_nll = _metric(rec, "valid/loss"), _metric(rec, "test/nll")
    _count(rec, "test/n_tokens")
    _checked_positions(rec)
    out = copy.deepcopy(rec)
    final = out["final"]
    final.update({f"own/{k}": v for k, v in rec["final"].items() if "/" in k and not k.startswith("own/")})
    final["valid/loss"] = valid_loss * v_scale
    final["valid/perplexity"] = math.exp(final["valid/loss"])
    final["test/loss"] = test_nll / t_ref
    final["test/perplexity"] = math.exp(final["test/loss"])
    final["valid/n_tokens"], final["test/n_tokens"] = _count(ref, "valid/n_tokens"), t_ref
    curve = out.get("curve") or {}
    if curve.get("valid"):
        curve["valid"] = [[t / v_scale, loss * v_scale] for t, loss in curve["valid"]]
    best = out.get("best") or {}
    if best.get("metric") == "valid/loss":
        best["value"] = best["value"] * v_scale
        if best.get("tokens"):
            best["tokens"] = best["tokens"] / v_scale
    if out.get("tokens"):
        out["tokens"] = out["tokens"] / v_scale
    out["reference"] = {
        "cell": ref.get("cell"),
        "variant": ref.get("variant"),
        "seed": ref.get("seed"),
        "valid_token_ratio": v_scale,
        "test_token_ratio": _count(rec, "test/n_tokens") / t_ref,
    }
    return out


def _checked_positions(rec: dict) -> None:
    """The parts of ``rec`` that :func:`to_reference` rescales besides ``final``: ``curve['valid']`` (pairs of
    numbers), ``best`` (its value when it is the validation loss, its tokens) and ``tokens``."""
    curve = rec.get("curve")
    if curve is not None and not isinstance(curve, dict):
        raise ValueError(f"record {_name(rec)}: curve={curve!r}; expected a dict of [tokens, loss] lists")
    points = (curve or {}).get("valid") or []
    if not isinstance(points, list):
        raise ValueError(f"record {_name(rec)}: curve['valid']={points!r}; expected a list of [tokens, loss]")
    for point in points:
        if not isinstance(point, (list, tuple)) or len(point) != 2:
            raise ValueError(f"record {_name(rec)}: curve['valid'] holds {point!r}; expected [tokens, loss]")
        for x in point:
            _number(rec, "a curve['valid'] point", x)
    best = rec.get("best")
    if best is not None and not isinstance(best, dict):
        raise ValueError(f"record {_name(rec)}: best={best!r}; expected a dict")
    best = best or {}
    if best.get("metric") == "valid/loss":
        _number(rec, "best['value']", best.get("value"))
    if best.get("tokens"):
        _number(rec, "best['tokens']", best["tokens"])
    if rec.get("tokens"):
        _number(rec, "tokens", rec["tokens"])


def fresh_records(records: dict, fresh: tuple[str, str], ref: tuple[str, str]) -> dict:
    """``records`` with every run of the cell/variant ``fresh`` rewritten by :func:`to_reference` against the
    same seed's run of ``ref`` (runs without that partner are left out)."""
    out = {k: v for k, v in records.items() if k[:2] != fresh}
    for (c, v, s), rec in records.items():
        if (c, v) == fresh and (*ref, s) in records:
            out[(c, v, s)] = to_reference(rec, records[(*ref, s)])
    return out


def fresh_note(fresh: list[dict], main: list[dict], factor: float) -> str:
    """One paragraph on the fresh arm: its tokenizer's token ratio and where its runs stopped."""
    if not fresh:
        return ""
    ratio = sum(r["reference"]["test_token_ratio"] for r in fresh) / len(fresh)
    epochs = [r.get("epochs") or 0 for r in fresh]
    stops = ", ".join(sorted({str(r.get("stop_reason")) for r in fresh}))
    a = sum(best_loss(r) for r in fresh) / len(fresh)
    b = sum(best_loss(r) for r in main) / len(main) if main else math.nan
    return (
        f"C6 with fresh data ({len(fresh)} seeds): standard on {factor}x the training articles, its own "
        f"tokenizer (it cuts the test text into {ratio:.3f}x the 1x tokenizer's tokens), stopped at "
        f"{min(epochs):.1f}-{max(epochs):.1f} of its epochs ({stops}); best validation loss {a:.4f} against "
        f"{b:.4f} for standard at 1x (same seeds; both per 1x-tokenizer token). The C6-fresh row, its tokens "
        "ratio and the figure use this arm's values per 1x-tokenizer token (total nats of the same text; see "
        "converged_fresh.py); the runs table lists its own-tokenizer values."
    )

"""Records of one text scored with another tokenizer, expressed per token of a reference tokenizer.

A fresh-data arm (:class:`coupled_qk.study.grid.Tuned` with ``data > 1``) trains on a larger training split with
its *own* BPE tokenizer, so its per-token losses count other tokens than the reference runs'. Both are scored on
the same validation and test text, so a comparison uses that text's total log-likelihood (nats), which does not
depend on the tokenizer: :func:`to_reference` rewrites a record in the units of a reference record (its
tokenizer's token counts), after which every analysis applies unchanged (the paired relative difference of test
perplexity, the tokens-to-equal-loss ratio, the curves). A relative difference of these perplexities is a
monotone transform of the difference in bits per byte. An arm is read this way through
:attr:`coupled_qk.study.claims.Arm.per_tokens_of`.
"""

from __future__ import annotations

import copy
import math


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

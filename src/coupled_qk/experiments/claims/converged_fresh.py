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


def _count(rec: dict, split: str) -> int:
    n = (rec.get("final") or {}).get(f"{split}/n_tokens")
    if not n or n <= 0:
        raise ValueError(f"record {rec.get('cell')}/{rec.get('variant')}/seed{rec.get('seed')} has no "
                         f"final['{split}/n_tokens'] (needed to compare across tokenizers)")
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
        ValueError: a record lacks the token counts, or the test text differs (byte counts disagree).
    """
    fo, fr = rec["final"], ref["final"]
    if fo.get("test/n_bytes") != fr.get("test/n_bytes") or fo.get("valid/n_bytes") != fr.get("valid/n_bytes"):
        raise ValueError("records scored different validation/test text (n_bytes differ): cannot compare "
                         f"{rec.get('cell')} with {ref.get('cell')} across tokenizers")
    v_scale = _count(rec, "valid") / _count(ref, "valid")
    t_ref = _count(ref, "test")
    out = copy.deepcopy(rec)
    final = out["final"]
    final.update({f"own/{k}": v for k, v in rec["final"].items() if "/" in k and not k.startswith("own/")})
    final["valid/loss"] = fo["valid/loss"] * v_scale
    final["valid/perplexity"] = math.exp(final["valid/loss"])
    final["test/loss"] = fo["test/nll"] / t_ref
    final["test/perplexity"] = math.exp(final["test/loss"])
    final["valid/n_tokens"], final["test/n_tokens"] = _count(ref, "valid"), t_ref
    curve = out.get("curve", {})
    if curve.get("valid"):
        curve["valid"] = [[t / v_scale, loss * v_scale] for t, loss in curve["valid"]]
    best = out.get("best") or {}
    if best.get("metric") == "valid/loss":
        best["value"] = best["value"] * v_scale
        if best.get("tokens"):
            best["tokens"] = best["tokens"] / v_scale
    if out.get("tokens"):
        out["tokens"] = out["tokens"] / v_scale
    out["reference"] = {"cell": ref.get("cell"), "variant": ref.get("variant"), "seed": ref.get("seed"),
                        "valid_token_ratio": v_scale, "test_token_ratio": _count(rec, "test") / t_ref}
    return out


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
    return (f"C6 with fresh data ({len(fresh)} seeds): standard on {factor}x the training articles, its own "
            f"tokenizer (it cuts the test text into {ratio:.3f}x the 1x tokenizer's tokens), stopped at "
            f"{min(epochs):.1f}-{max(epochs):.1f} of its epochs ({stops}); best validation loss {a:.4f} against "
            f"{b:.4f} for standard at 1x (same seeds; both per 1x-tokenizer token). Perplexities and curves of this "
            "arm are per 1x-tokenizer token (total nats of the same text; see converged_fresh.py).")

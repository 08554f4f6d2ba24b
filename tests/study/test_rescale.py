"""C6 with fresh data: records of another tokenizer are rewritten per token of the 1x tokenizer, so the same
text's total log-likelihood decides (hand-derived cases; the paired analysis then applies unchanged)."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coupled_qk.study.rescale import to_reference


def _rec(n_valid, n_test, valid_loss, test_loss, curve=(), best_tokens=1000, cell="c", seed=0):
    final = {
        "valid/n_tokens": n_valid,
        "valid/n_bytes": 4000,
        "valid/loss": valid_loss,
        "test/n_tokens": n_test,
        "test/n_bytes": 20000,
        "test/loss": test_loss,
        "test/nll": test_loss * n_test,
        "test/perplexity": math.exp(test_loss),
    }
    return {
        "cell": cell,
        "variant": "standard",
        "seed": seed,
        "final": final,
        "tokens": 2000,
        "curve": {"valid": [list(x) for x in curve]},
        "best": {"metric": "valid/loss", "value": valid_loss, "tokens": best_tokens},
    }


def test_same_token_counts_change_nothing():
    a = _rec(1000, 5000, 5.1, 5.0, curve=[(100, 6.0), (200, 5.1)])
    b = to_reference(a, _rec(1000, 5000, 4.0, 4.0))
    assert b["final"]["test/perplexity"] == pytest.approx(a["final"]["test/perplexity"], rel=1e-12)
    assert b["final"]["valid/loss"] == pytest.approx(5.1) and b["curve"]["valid"] == [[100, 6.0], [200, 5.1]]
    assert a["final"]["valid/loss"] == 5.1  # the input is not modified


def test_fewer_tokens_for_the_same_text_carry_more_nats_each():
    # the fresh tokenizer cuts the text into 10% fewer tokens: per 1x token, its loss is 0.9x its own
    fresh = _rec(900, 4500, 5.0, 5.0, curve=[(900, 5.5)], best_tokens=1800)
    ref = _rec(1000, 5000, 5.2, 5.2)
    out = to_reference(fresh, ref)
    assert out["final"]["test/loss"] == pytest.approx(5.0 * 4500 / 5000)
    assert out["final"]["test/perplexity"] == pytest.approx(math.exp(4.5))
    assert out["final"]["valid/loss"] == pytest.approx(4.5) and out["best"]["value"] == pytest.approx(4.5)
    assert out["curve"]["valid"] == [[pytest.approx(1000), pytest.approx(4.95)]]
    assert out["best"]["tokens"] == pytest.approx(2000) and out["final"]["own/test/loss"] == 5.0
    assert out["reference"]["test_token_ratio"] == pytest.approx(0.9)


@given(st.integers(100, 10_000), st.integers(100, 10_000), st.floats(1.0, 8.0))
def test_total_nats_of_the_text_are_invariant(n_own, n_ref, loss):
    out = to_reference(_rec(n_own, n_own * 5, loss, loss), _rec(n_ref, n_ref * 5, 3.0, 3.0))
    assert out["final"]["test/loss"] * n_ref * 5 == pytest.approx(loss * n_own * 5, rel=1e-9)
    assert out["final"]["valid/loss"] * n_ref == pytest.approx(loss * n_own, rel=1e-9)


def test_other_text_or_missing_counts_are_refused():
    ref = _rec(1000, 5000, 5.2, 5.2)
    other = _rec(1000, 5000, 5.2, 5.2)
    other["final"]["test/n_bytes"] = 1
    with pytest.raises(ValueError, match="different validation/test text"):
        to_reference(other, ref)
    bare = _rec(1000, 5000, 5.2, 5.2)
    del bare["final"]["valid/n_tokens"]
    with pytest.raises(ValueError, match="valid/n_tokens"):
        to_reference(bare, ref)


def test_an_arm_read_per_token_of_another_is_rewritten_with_its_seeds_partner_only():
    """An arm with ``per_tokens_of`` reads each record through :func:`to_reference` against the same seed's record
    of the other arm; a seed without that partner has no value; other arms are read as they are."""
    from coupled_qk.study.claims import Arm, Evidence
    from coupled_qk.study.design import Plan

    recs = {
        ("fresh", "standard", 0): _rec(900, 4500, 5.0, 5.0, cell="fresh"),
        ("fresh", "standard", 1): _rec(900, 4500, 5.0, 5.0, cell="fresh", seed=1),
        ("main", "coupled", 0): _rec(1000, 5000, 5.2, 5.2, cell="main"),
        ("main", "standard", 0): _rec(1000, 5000, 5.3, 5.3, cell="main"),
    }
    ev = Evidence("s", Plan([]), recs)
    fresh = Arm("fresh", "standard", per_tokens_of=Arm("main", "coupled"))
    assert ev.seeds(fresh) == [0]  # no coupled seed 1 to pair with
    assert ev.record(fresh, 0)["final"]["test/loss"] == pytest.approx(4.5)
    assert ev.values(fresh, metric="test/perplexity") == {0: pytest.approx(math.exp(4.5))}
    assert ev.record(Arm("main", "standard"), 0) is recs[("main", "standard", 0)]
    assert recs[("fresh", "standard", 0)]["final"]["test/loss"] == 5.0  # the stored record is not modified


def test_the_note_states_the_token_ratio_and_both_best_losses_per_1x_token():
    from coupled_qk.study.stage_report import fresh_note

    fresh = to_reference(_rec(900, 4500, 5.0, 5.0, cell="fresh"), _rec(1000, 5000, 5.2, 5.2))
    fresh.update(epochs=7.5, stop_reason="patience")
    note = fresh_note([fresh], [_rec(1000, 5000, 5.1, 5.1)], 2.4)
    assert "0.900x the 1x tokenizer's tokens" in note and "7.5-7.5 of its epochs (patience)" in note
    assert "best validation loss 4.5000 against 5.1000" in note
    assert fresh_note([], [], 2.4) == ""


# what to_reference reads: from the fresh record every field below, from the reference only the counts
COUNTS = ("valid/n_tokens", "test/n_tokens", "valid/n_bytes", "test/n_bytes")
REC_FIELDS = COUNTS + ("valid/loss", "test/nll")
_MISSING = object()


@given(
    st.sampled_from([("rec", k) for k in REC_FIELDS] + [("ref", k) for k in COUNTS]),
    st.sampled_from([_MISSING, None, "5", True, math.nan, math.inf, -math.inf, [1]])
    | st.integers(max_value=0)
    | st.floats(0.01, 1e6).filter(lambda f: not f.is_integer()),
)
def test_a_missing_or_malformed_field_is_one_error_naming_it(where, bad):
    side, key = where
    if (
        key in ("valid/loss", "test/nll")
        and isinstance(bad, (int, float))
        and not isinstance(bad, bool)
        and math.isfinite(bad)
    ):
        return  # any finite loss is a loss
    rec, ref = _rec(900, 4500, 5.0, 5.0, curve=[(900, 5.5)]), _rec(1000, 5000, 5.2, 5.2)
    final = (rec if side == "rec" else ref)["final"]
    if bad is _MISSING:
        del final[key]
    else:
        final[key] = bad
    with pytest.raises(ValueError, match=f"record c/standard/seed0.*{key}"):
        to_reference(rec, ref)


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("final", None, "no 'final' metrics"),
        ("final", [1], "no 'final' metrics"),
        ("curve", "x", "curve="),
        ("curve", {"valid": 3}, r"curve\['valid'\]="),
        ("curve", {"valid": [[1]]}, "expected \\[tokens, loss\\]"),
        ("curve", {"valid": [[1, None]]}, "curve"),
        ("best", "x", "best="),
        ("best", {"metric": "valid/loss"}, r"best\['value'\]=None"),
        ("best", {"metric": "valid/loss", "value": 5.0, "tokens": "9"}, r"best\['tokens'\]"),
        ("tokens", "2000", "tokens='2000'"),
    ],
)
def test_malformed_parts_of_the_fresh_record_are_named(field, value, match):
    rec = _rec(900, 4500, 5.0, 5.0, curve=[(900, 5.5)])
    rec[field] = value
    with pytest.raises(ValueError, match=match):
        to_reference(rec, _rec(1000, 5000, 5.2, 5.2))


def test_records_without_byte_counts_are_not_taken_as_the_same_text():
    rec, ref = _rec(900, 4500, 5.0, 5.0), _rec(1000, 5000, 5.2, 5.2)
    for r in (rec, ref):
        del r["final"]["valid/n_bytes"], r["final"]["test/n_bytes"]
    with pytest.raises(ValueError, match="n_bytes"):
        to_reference(rec, ref)

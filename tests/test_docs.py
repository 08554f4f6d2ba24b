"""The README's counts, lists and quoted results, regenerated from the code and the committed reports.

Statements that drift (a test count, a list of variants, a number copied from a report) are either generated
here from their source and compared, or removed from the README. Each test names the README passage it keeps
honest; a failure says what the README should say now.
"""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
FLAT = " ".join(README.split())  # for sentences, wherever the lines wrap
CLAIMS = ROOT / "docs" / "results" / "claims"
PROTOCOLS = ("cpu", "cpu-short")


def _report(protocol: str) -> dict:
    return json.loads((CLAIMS / f"{protocol}.json").read_text())


def _block(name: str) -> str:
    m = re.search(rf"<!-- {re.escape(name)}(?: [^>]*)? -->\n(.*?)\n?<!-- /{re.escape(name)} -->", README, re.S)
    assert m, f"README has no <!-- {name} --> ... <!-- /{name} --> block"
    return m.group(1).strip()


def _backticked(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


@pytest.mark.parametrize("protocol", [*PROTOCOLS, "cpu-converged", "cpu-converged-pubmed"])
def test_claims_tables_are_the_committed_reports(protocol):
    assert _block(f"claims:{protocol}") == (CLAIMS / f"{protocol}-readme.md").read_text().strip(), (
        f"copy docs/results/claims/{protocol}-readme.md into the README's claims:{protocol} block"
    )


def test_verdict_readings_table_is_generated_from_the_reports():
    from coupled_qk.experiments.claims.power import verdict_readings_table

    expected = verdict_readings_table({p: _report(p) for p in PROTOCOLS})
    assert _block("verdict-readings") == expected, "regenerate the table:\n" + expected


def test_quoted_claim_rows_match_the_reports():
    """Every "claim row C1, `cpu`: -0.76 [-1.79, 0.28], n = 5" in the README is the report's row."""
    quotes = re.findall(r"claim row (C\d+), `([\w-]+)`: (\S+) \[(\S+), (\S+)\],[\s>]+n = (\d+)", README)
    assert len(quotes) >= 6  # the single-seed illustrations each link to their claim rows
    for cid, protocol, mean, low, high, n in quotes:
        row = next(r for r in _report(protocol)["rows"] if r["id"] == cid)
        assert (mean, low, high, int(n)) == (
            f"{row['mean']:.2f}",
            f"{row['low']:.2f}",
            f"{row['high']:.2f}",
            row["n"],
        ), (cid, protocol)


def test_summary_sentences_hold_for_each_protocol():
    """The "So at CPU scale" paragraph: which paper values lie inside the intervals, protocol by protocol."""
    from coupled_qk.experiments.claims.power import null_reading

    inside = {p: [r["id"] for r in _report(p)["rows"] if r.get("paper_effect_in_ci") is True] for p in PROTOCOLS}
    assert inside == {"cpu": [], "cpu-short": ["C4", "C7", "C10"]}
    assert "at 262k (`cpu-short`) three of them (C4 stability, C7 size, C10 web text)" in FLAT
    reproduced = {p: [r["id"] for r in _report(p)["rows"] if r["verdict"] == "reproduced"] for p in PROTOCOLS}
    assert reproduced == {"cpu": ["C2"], "cpu-short": []}
    c1 = null_reading(next(r for r in _report("cpu-short")["rows"] if r["id"] == "C1"))
    assert c1["reading"] == "excluded"
    assert f"with {100 * c1['power_at_paper']:.0f}% power against it" in FLAT
    assert f"The `cpu` protocol is complete ({_report('cpu')['n_records']} runs)" in FLAT


def test_lists_in_the_readme_are_the_registries():
    from coupled_qk.data.corpora import KNOWN_CORPORA
    from coupled_qk.experiments.claims.protocols import PROTOCOLS as REGISTERED_PROTOCOLS
    from coupled_qk.models.catalog import documented_maps, tables
    from coupled_qk.models.config import PRESETS

    # the attentions of the maps docs/DESIGN.md documents (a drop-in map needs no README edit)
    design = tables(documented_maps((ROOT / "docs" / "DESIGN.md").read_text()))["attentions"]
    variants = re.search(r"with every scoring rule \(.*?\): (.*?)\n  Adding a variant", README, re.S).group(1)
    assert sorted(_backticked(variants)) == sorted(re.findall(r"^\| `(\w+)` \|", design, re.M))
    presets = re.search(r"presets (`[^.]*?`), exact parameter counts", README, re.S).group(1)
    assert _backticked(presets) == list(PRESETS)
    protocols = re.search(r"runs a named protocol \((.*?); see", README, re.S).group(1)
    assert sorted(_backticked(protocols)) == sorted(REGISTERED_PROTOCOLS)
    corpora = re.search(r"^Corpora: (.*?)\(`-raw` too", README, re.S | re.M).group(1)
    named = [c for c in _backticked(corpora) if not c.startswith(".")]  # `../shared/data` is a folder
    assert sorted(named) == sorted(c for c in KNOWN_CORPORA if not c.endswith("-raw"))


def test_counts_in_the_readme_are_the_code():
    from tests.test_cli_errors import BAD

    assert f"a {len(BAD)}-row table of bad command lines" in FLAT
    assert not re.search(r"about [\d,]+ tests", FLAT), "a test count drifts: remove it"
    for sentence in re.split(r"(?<=[.;])\s", FLAT):
        if "TensorBoard events" in sentence:  # only with the optional extra
            assert "[tensorboard]" in sentence, sentence


def test_quick_start_names_both_demos_and_the_quick_settings():
    from coupled_qk.commands.demo import QUICK_DEFAULTS, QUICK_EVAL_WINDOWS

    start = README.split("```bash", 1)[1].split("```", 1)[0]
    assert "coupled-qk demo --quick" in start and re.search(r"coupled-qk demo\s+#", start)
    assert f"{QUICK_DEFAULTS['max_tokens']:,} training tokens per variant" in FLAT
    assert f"the first {QUICK_EVAL_WINDOWS} windows of WikiText-2 valid and test" in FLAT
    assert f"`./{QUICK_DEFAULTS['out_dir']}`" in FLAT

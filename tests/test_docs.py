"""README.md and docs/*.md: generated blocks equal their generators, every ``python`` block runs, every relative link
and ``#anchor`` resolves, and the README's commands are the ones CI runs.

Prose is never parsed for facts: what can drift is a generated block (``coupled_qk.commands.docs_blocks``;
regenerate with ``python -m coupled_qk.commands.docs_blocks``). A ``python`` block that needs an optional extra,
the shared data or a file on disk says so on the line before its fence, e.g. ``<!-- needs: hf, run:runs/x -->``
(:data:`NEEDS`); the block then runs in a fresh folder holding those files.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch

from coupled_qk.commands import docs_blocks

ROOT = Path(__file__).resolve().parents[1]
PAGES = docs_blocks.pages(ROOT)
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)
NEEDS_MARKER = re.compile(r"<!-- needs: ([^>]*?) -->\n$")


# ---------------------------------------------------------------------------------------------------------------
# generated blocks
# ---------------------------------------------------------------------------------------------------------------


def test_every_generated_block_equals_its_generator():
    stale = docs_blocks.stale_blocks(ROOT)
    assert not stale, f"stale generated blocks {stale}: run python -m coupled_qk.commands.docs_blocks"


def test_every_block_has_a_generator_and_every_generator_a_block():
    used = {(kind, name) for page in PAGES for kind, name, _ in docs_blocks.blocks(page.read_text())}
    unknown = {n for kind, n in used if kind == "generated" and n not in docs_blocks.GENERATORS}
    assert not unknown, f"blocks without a generator: {sorted(unknown)}"
    assert {n for kind, n in used if kind == "generated"} >= set(docs_blocks.GENERATORS)


def test_every_committed_claims_headline_is_shown():
    """Each ``docs/results/claims/<name>-readme.md`` that ``coupled-qk claims`` writes is copied into a page."""
    shown = {name for page in PAGES for kind, name, _ in docs_blocks.blocks(page.read_text()) if kind == "claims"}
    committed = {p.name.removesuffix("-readme.md") for p in (ROOT / docs_blocks.CLAIMS_DIR).glob("*-readme.md")}
    assert committed <= shown, f"claims reports not shown on any page: {sorted(committed - shown)}"


def test_the_command_rewrites_a_stale_block_and_check_names_it(tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    page = "intro\n<!-- BEGIN generated: demo-quick -->\nold\n<!-- END generated: demo-quick -->\nend\n"
    (tmp_path / "README.md").write_text(page)
    (tmp_path / "docs" / "X.md").write_text(
        "<!-- BEGIN generated: not-ours -->\nkept\n<!-- END generated: not-ours -->\n"
    )
    assert docs_blocks.main(["--root", str(tmp_path), "--check"]) == 1
    assert "stale: README.md: demo-quick" in capsys.readouterr().out
    assert (tmp_path / "README.md").read_text() == page  # --check changes nothing
    assert docs_blocks.main(["--root", str(tmp_path)]) == 0
    new = (tmp_path / "README.md").read_text()
    assert new == page.replace("old\n", docs_blocks.demo_quick(tmp_path))
    assert "kept" in (tmp_path / "docs" / "X.md").read_text()  # a block of another generator is left alone
    assert docs_blocks.main(["--root", str(tmp_path), "--check"]) == 0


def test_claims_blocks_copy_the_report_without_its_final_newline(tmp_path):
    claims = tmp_path / docs_blocks.CLAIMS_DIR
    claims.mkdir(parents=True)
    (claims / "demo-readme.md").write_text("**headline** with [a link](x.md)\n")
    for body in ("", "stale text\n", "stale\ntext"):
        page = f"a\n<!-- claims:demo -->\n{body}<!-- /claims:demo -->\nb\n"
        assert docs_blocks.regenerate(page, tmp_path) == (
            "a\n<!-- claims:demo -->\n**headline** with [a link](x.md)\n<!-- /claims:demo -->\nb\n"
        )
    with pytest.raises(FileNotFoundError, match=r"claims:gone --> copies .*gone-readme.md.*--report-only"):
        docs_blocks.regenerate("<!-- claims:gone -->\n<!-- /claims:gone -->\n", tmp_path)


def test_the_speed_block_shows_the_tracked_result_it_reads(tmp_path):
    """``speed-tracked`` shows the measured revision, the machine line and each row's median [interval] (ms for
    standard); without the result it names the file and the command that writes it."""
    with pytest.raises(FileNotFoundError, match=r"tracked-tiny-cpu\.json.*python benchmarks/ab\.py --tracked"):
        docs_blocks.speed_tracked(tmp_path)
    cells = [{"name": "decode-eager-b1"}, {"name": "train-b8"}]
    rows = [
        dict(cell="decode-eager-b1", variant="standard", new=dict(median=1.5, low=1.25, high=1.75)),
        dict(cell="decode-eager-b1", variant="coupled", new=dict(median=1.0624, low=1.05, high=1.08)),
        dict(cell="train-b8", variant="standard", new=dict(median=40.0, low=39.0, high=41.5)),
        dict(cell="train-b8", variant="coupled", new=None),
    ]
    result = dict(
        settings=dict(preset="tiny", repeats=7, threads=1, clock="step", cells=cells, variants=["standard", "coupled"]),
        revisions={"new": {"label": "abc1234", "commit": "abc1234" + "0" * 33}, "old": {"label": "def5678"}},
        machine=dict(cpu="Some CPU", cpu_count=2, torch="2.13.0+cpu", threads=1, platform="Linux"),
        load=[1.0, 2.5],
        date="D",
        reproduce="python benchmarks/ab.py --tracked benchmarks/tracked.json --repeats 7",
        rows=rows,
    )
    path = tmp_path / docs_blocks.TRACKED_RESULT
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(result))
    with pytest.raises(FileNotFoundError, match=r"ab_measure\.py does not exist"):
        docs_blocks.speed_tracked(tmp_path)
    for name in ("ab_measure.py", "ab_worker.py"):  # the block's tables come from the repository's A/B tool
        shutil.copy(ROOT / "benchmarks" / name, tmp_path / "benchmarks" / name)
    text = docs_blocks.speed_tracked(tmp_path)
    assert text.startswith("Measured at abc1234 (`abc1234" + "0" * 33 + "`) on D by `python benchmarks/ab.py --tracked")
    assert "7 repeats interleaved with def5678, 1 thread, clock step" in text and "load 1.0 before, 2.5 after" in text
    assert "- machine: Some CPU (2 logical CPUs); torch 2.13.0+cpu, 1 threads; Linux" in text
    assert "| variant | decode-eager-b1 | train-b8 |" in text
    assert "| standard | 1.500 ms [1.250, 1.750] | 40.000 ms [39.000, 41.500] |" in text
    assert "| coupled | 1.062x [1.050, 1.080] | - |" in text


# ---------------------------------------------------------------------------------------------------------------
# the README's commands are CI's
# ---------------------------------------------------------------------------------------------------------------


def test_the_readme_runs_the_tests_exactly_as_ci_does():
    """``.ci/run`` installs a pinned torch, then the project with its test extras, then runs one command line;
    the README's first ``bash`` block says the same (the demo line installs the same torch)."""
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    installs = [line.split("--quiet ", 1)[1] for line in ci if line.startswith("python -m pip install --quiet ")]
    assert installs[1:] == ["torch==2.13.0", '-e ".[test]"'], installs
    test_command = [line for line in ci if line.strip() and not line.startswith("#")][-1]
    first_bash = FENCE.search((ROOT / "README.md").read_text()).group(2).splitlines()
    expected = f"pip install {installs[1]} && pip install {installs[2]} && {test_command}"
    assert any(line.startswith(expected + " ") or line == expected for line in first_bash), (expected, first_bash)
    assert any(
        line.startswith(f"pip install {installs[1]} && pip install -e . && coupled-qk demo --quick")
        for line in first_bash
    )


# ---------------------------------------------------------------------------------------------------------------
# every python block runs
# ---------------------------------------------------------------------------------------------------------------


def python_blocks() -> list[tuple[str, int, str, tuple[str, ...]]]:
    """``(page, line, code, needs)`` of every ``python`` block of the pages; ``needs`` from the marker on the line
    before the fence."""
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            if m.group(1) != "python":
                continue
            before = text[: m.start()]
            marker = NEEDS_MARKER.search(before)
            needs = tuple(n.strip() for n in marker.group(1).split(",")) if marker else ()
            out.append((page.relative_to(ROOT).as_posix(), before.count("\n") + 1, m.group(2), needs))
    return out


BLOCKS = python_blocks()


def _tiny_run(cache: Path) -> Path:
    """A tiny trained language-model run (one layer, a 300-token BPE, two steps): made once per session."""
    run = cache / "tiny-run"
    if not run.exists():
        from coupled_qk.training.config import TrainConfig
        from coupled_qk.training.loop import train
        from tests.conftest import write_corpus

        corpus = write_corpus(cache / "corpus")
        model = dict(n_layer=1, d_model=32, n_heads=2, block_size=64, attention="coupled")
        cfg = dict(corpus=str(corpus), tokenizer="bpe-300", cache_dir=str(cache / "cache"), model=model, batch_size=2)
        cfg.update(max_steps=2, warmup_steps=1, eval_interval=2, eval_batches=1, out_dir=str(run))
        train(TrainConfig.from_dict({**cfg, "progress": False, "tensorboard": False}))
    return run


def _hf_export(cache: Path) -> Path:
    out = cache / "tiny-export"
    if not out.exists():
        from coupled_qk.cli import main

        assert main(["export", str(_tiny_run(cache)), str(out)]) == 0
    return out


def _llama(cache: Path) -> Path:
    out = cache / "tiny-llama"
    if not out.exists():
        import transformers

        small = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2)
        config = transformers.LlamaConfig(**small, num_attention_heads=4, num_key_value_heads=2)
        transformers.LlamaForCausalLM(config).save_pretrained(out)
    return out


def _data(cache: Path) -> None:
    from coupled_qk.data.paths import default_data_dir

    try:
        default_data_dir()
    except FileNotFoundError as e:
        pytest.skip(f"needs the shared data: {e}")


NEEDS = {
    "hf": lambda cache: pytest.importorskip("transformers"),
    "peft": lambda cache: pytest.importorskip("peft"),
    "data": _data,
    "run": _tiny_run,
    "hf-export": _hf_export,
    "llama": _llama,
}
"""Marker words: an extra or the shared data (skipped where missing), or ``NAME:PATH``, a file the block reads,
copied to ``PATH`` in the block's folder."""


@pytest.fixture(scope="session")
def made(tmp_path_factory):
    return tmp_path_factory.mktemp("doc-fixtures")


@pytest.mark.parametrize("page,line,code,needs", BLOCKS, ids=[f"{p}:{n}" for p, n, _, _ in BLOCKS])
def test_python_block_runs(page, line, code, needs, made, tmp_path, monkeypatch, capsys):
    from coupled_qk.models import registry

    for need in needs:
        name, _, path = need.partition(":")
        assert name in NEEDS, f"{page}:{line}: unknown need {name!r} (known: {sorted(NEEDS)})"
        with warnings.catch_warnings():  # a fixture's own warnings (its tiny corpus's noisy splits) are not the block's
            warnings.simplefilter("ignore")
            source = NEEDS[name](made)
        if path:
            shutil.copytree(source, tmp_path / path)
    monkeypatch.chdir(tmp_path)
    module = types.ModuleType("doc_block")  # a real module: dataclasses defined in a block look theirs up
    monkeypatch.setitem(sys.modules, module.__name__, module)
    torch.manual_seed(0)
    with registry.isolated():
        exec(compile(code, f"{page}:{line}", "exec"), module.__dict__)


def test_every_page_with_python_has_a_block_found():
    """The block finder sees every fence: a ``python`` fence it missed would never run."""
    found = {(p, n) for p, n, _, _ in BLOCKS}
    for page in PAGES:
        for n, text in enumerate(page.read_text().splitlines(), 1):
            if text.strip() == "```python":
                assert (page.relative_to(ROOT).as_posix(), n) in found


# ---------------------------------------------------------------------------------------------------------------
# links
# ---------------------------------------------------------------------------------------------------------------

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """``text`` without fenced blocks and inline code (links there are not links)."""
    text = re.sub(r"^```.*?^```$", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: link targets dropped, lower case, every character but letters, digits, ``_``,
    ``-`` and spaces removed, spaces to ``-`` (github-slugger)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a markdown page's headings, with GitHub's ``-1``, ``-2`` suffixes for repeats."""
    seen: dict[str, int] = {}
    out = set()
    text = re.sub(r"^```.*?^```$", "", page.read_text(), flags=re.S | re.M)
    for m in re.finditer(r"^#{1,6} +(.*?) *#*$", text, re.M):
        s = slug(m.group(1))
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


def test_slug_follows_github():
    assert slug("Does coupling help? The claims report") == "does-coupling-help-the-claims-report"
    assert slug("At 1M tokens per run (protocol `cpu`)") == "at-1m-tokens-per-run-protocol-cpu"
    assert slug("Adding an attention variant: one file, one registration") == (
        "adding-an-attention-variant-one-file-one-registration"
    )
    assert slug("Hugging Face: export, `AutoModelForCausalLM`") == "hugging-face-export-automodelforcausallm"


LINKED_PAGES = [*PAGES, ROOT / "benchmarks" / "README.md"]


@pytest.mark.parametrize("page", LINKED_PAGES, ids=[p.relative_to(ROOT).as_posix() for p in LINKED_PAGES])
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_link_check_sees_a_broken_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## Two words\n\n[ok](#two-words) [bad](#three) `[no](#code)`\n")
    targets = LINK.findall(_prose((tmp_path / "a.md").read_text()))
    assert targets == ["#two-words", "#three"]
    assert anchors(tmp_path / "a.md") == {"title", "two-words"}

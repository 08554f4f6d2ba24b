"""The generated lists of docs/DESIGN.md (attentions with their options, named variants, presets) match the
registry (:mod:`coupled_qk.models.catalog`). Regenerate them with ``coupled-qk describe --write-docs``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from coupled_qk.cli import main
from coupled_qk.models.catalog import BLOCK, documented_maps, package_maps, stale_blocks, tables

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "DESIGN.md"
PAPER_MAPS = ("dynamics", "query_mlp", "invertible")
"""The maps of the paper (v1's dynamics and its uncoupled baseline, v2's coupling): always documented."""


def test_generated_lists_in_design_md_match_the_registry():
    text = DESIGN.read_text()
    documented = documented_maps(text)
    assert set(PAPER_MAPS) <= set(documented), f"docs/DESIGN.md documents the maps {documented}"
    stale = stale_blocks(text)
    assert not stale, (
        f"docs/DESIGN.md: the generated block(s) {stale} are out of date; run coupled-qk describe --write-docs"
    )


def test_write_docs_rewrites_only_the_stale_blocks(tmp_path, capsys):
    page = tmp_path / "DESIGN.md"
    shutil.copy(DESIGN, page)
    text = page.read_text()
    old = text.replace("| `tiny` | 8,192 |", "| `tiny` | 4,096 |")
    assert old != text
    page.write_text(old)
    assert stale_blocks(old) == ["presets"]
    assert main(["describe", "--write-docs", str(page)]) == 0
    assert capsys.readouterr().out.strip() == f"{page}: rewrote presets"
    assert page.read_text() == text  # the rest of the page kept byte for byte
    assert main(["describe", "--write-docs", str(page)]) == 0
    assert "already current" in capsys.readouterr().out


def test_a_drop_in_map_is_current_without_a_row_and_gets_one_when_written(tmp_path):
    """A map added to the package (here registered by a test, its class in ``coupled_qk``'s namespace) does not
    make the page stale; ``--write-docs`` adds its rows."""
    from coupled_qk.models import registry
    from coupled_qk.models.maps.query_mlp import QueryMLP, QueryMLPOptions

    page = tmp_path / "DESIGN.md"
    shutil.copy(DESIGN, page)
    with registry.isolated():
        registry.register_qk_map("query_mlp_copy", "mlp_copy", QueryMLP, QueryMLPOptions, in_defaults=False)
        assert "query_mlp_copy" in package_maps()
        assert stale_blocks(page.read_text()) == []
        main(["describe", "--write-docs", str(page)])
        assert "query_mlp_copy" in documented_maps(page.read_text())
        assert "| `mlp_copy_differential` | `query_mlp_copy` (`QueryMLP`) | differential |" in page.read_text()
        assert stale_blocks(page.read_text()) == []


def test_checker_sees_a_stale_block_and_a_missing_one():
    text = "a\n<!-- BEGIN generated: presets -->\n| old |\n<!-- END generated: presets -->\nb\n"
    (m,) = BLOCK.finditer(text)
    assert m.group(2) == "presets" and m.group(3) == "| old |\n" != tables(PAPER_MAPS)["presets"]
    with pytest.raises(ValueError, match=r"\['attentions', 'variants'\] are missing"):
        stale_blocks(text, PAPER_MAPS)
    with pytest.raises(ValueError, match=r"\['nope'\] are not registered"):
        tables(["nope"])

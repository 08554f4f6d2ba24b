"""The registry's tables in docs/DESIGN.md (attentions with their options, named variants, presets) and the front
page's variants table (:mod:`coupled_qk.models.catalog`, :mod:`coupled_qk.commands.docs_blocks`): current for the
maps DESIGN.md documents, so a drop-in map needs no doc edit; rewritten, with every map of the package, by
``python -m coupled_qk.commands.docs_blocks``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from coupled_qk.commands import docs_blocks
from coupled_qk.models.catalog import BLOCK, documented_maps, package_maps, stale_blocks, tables

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "DESIGN.md"
PAPER_MAPS = ("dynamics", "query_mlp", "invertible")
"""The maps of the paper (v1's dynamics and its uncoupled baseline, v2's coupling): always documented."""


def test_generated_lists_in_design_md_match_the_registry():
    text = DESIGN.read_text()
    documented = documented_maps(text)
    assert set(PAPER_MAPS) <= set(documented), f"docs/DESIGN.md documents the maps {documented}"
    stale = stale_blocks(text)
    assert not stale, (
        f"docs/DESIGN.md: the generated block(s) {stale} are out of date; run python -m coupled_qk.commands.docs_blocks"
    )


def _copy_pages(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    shutil.copy(DESIGN, tmp_path / "docs" / "DESIGN.md")
    readme = (ROOT / "README.md").read_text()
    start, end = readme.index("<!-- BEGIN generated: variants-table -->"), readme.index("<!-- END generated: variants")
    (tmp_path / "README.md").write_text(readme[start:end] + "<!-- END generated: variants-table -->\n")
    return tmp_path


def test_the_command_rewrites_only_the_stale_design_blocks(tmp_path, capsys):
    root = _copy_pages(tmp_path)
    page = root / "docs" / "DESIGN.md"
    text = page.read_text()
    old = text.replace("| `tiny` | 8,192 |", "| `tiny` | 4,096 |")
    assert old != text
    page.write_text(old)
    assert stale_blocks(old) == ["presets"]
    assert docs_blocks.main(["--root", str(root), "--check"]) == 1
    assert "stale: docs/DESIGN.md: presets" in capsys.readouterr().out
    assert docs_blocks.main(["--root", str(root)]) == 0
    assert page.read_text() == text  # the rest of the page kept byte for byte
    assert docs_blocks.main(["--root", str(root), "--check"]) == 0


def test_a_drop_in_map_is_current_without_rows_and_gets_them_when_written(tmp_path):
    """A map added to the package (here registered by a test, its class in ``coupled_qk``'s namespace) leaves
    DESIGN.md and the README current; rewriting the pages adds its rows to both."""
    from coupled_qk.models import registry
    from coupled_qk.models.maps.query_mlp import QueryMLP, QueryMLPOptions

    root = _copy_pages(tmp_path)
    with registry.isolated():
        registry.register_qk_map("query_mlp_copy", "mlp_copy", QueryMLP, QueryMLPOptions, in_defaults=False)
        assert "query_mlp_copy" in package_maps()
        assert docs_blocks.stale_blocks(root) == []
        assert docs_blocks.main(["--root", str(root)]) == 0
        design, readme = (root / "docs" / "DESIGN.md").read_text(), (root / "README.md").read_text()
        assert "query_mlp_copy" in documented_maps(design)
        assert "| `mlp_copy_differential` | `query_mlp_copy` (`QueryMLP`) | differential |" in design
        assert "| `mlp_copy_differential` | `QueryMLP` | differential |" in readme
        assert docs_blocks.stale_blocks(root) == []


def test_checker_sees_a_stale_block_and_a_missing_one():
    text = "a\n<!-- BEGIN generated: presets -->\n| old |\n<!-- END generated: presets -->\nb\n"
    (m,) = BLOCK.finditer(text)
    assert m.group(2) == "presets" and m.group(3) == "| old |\n" != tables(PAPER_MAPS)["presets"]
    with pytest.raises(ValueError, match=r"\['attentions', 'variants'\] are missing"):
        stale_blocks(text, PAPER_MAPS)
    with pytest.raises(ValueError, match=r"\['nope'\] are not registered"):
        tables(["nope"])

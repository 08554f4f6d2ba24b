"""The generated lists of docs/DESIGN.md (attentions with their options, named variants, presets) match the
registry. Regenerate them with ``COUPLED_QK_UPDATE_DOCS=1 python -m pytest tests/test_docs_sync.py``."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

from coupled_qk.models import registry
from coupled_qk.models.config import PRESETS

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "DESIGN.md"
BLOCK = re.compile(r"(<!-- BEGIN generated: (\w+) -->\n)(.*?)(<!-- END generated: \2 -->)", re.S)


def _defaults(options: type) -> str:
    return ", ".join(f"`{f.name}={f.default!r}`" for f in dataclasses.fields(options))


def generated() -> dict[str, str]:
    """The markdown of each generated block, from the library's registry: the built-in variants and the drop-ins
    of ``coupled_qk/models/maps/``, not third-party plugins (their map classes live outside ``coupled_qk``)."""
    registry.load_plugins()
    ours = [
        n
        for n, a in registry.ATTENTIONS.items()
        if a.qk_map is None or a.qk_map.module.__module__.startswith("coupled_qk.")
    ]
    a_rows = ["| attention | query-key map (class) | scoring | map options (defaults) |", "|---|---|---|---|"]
    for name in ours:
        a = registry.ATTENTIONS[name]
        m = a.qk_map
        a_rows.append(
            f"| `{name}` | {f'`{m.name}` (`{m.module.__name__}`)' if m else '-'} | {a.scoring} | "
            f"{_defaults(m.options) if m else '-'} |"
        )
    defaults = set(registry.default_variants())
    v_rows = ["| variant | `GPTConfig` overrides | in the default set |", "|---|---|---|"]
    for name, spec in registry.VARIANTS.items():
        if spec["attention"] not in ours:
            continue
        overrides = ", ".join(f"`{k}={v!r}`" for k, v in spec.items())
        v_rows.append(f"| `{name}` | {overrides} | {'yes' if name in defaults else 'no'} |")
    aliases = ", ".join(f"`{a}` = `{n}`" for a, n in registry.ALIASES.items())
    v_rows += ["", f"Aliases: {aliases}."]
    fields = ("vocab_size", "block_size", "n_layer", "d_model", "n_heads")
    p_rows = ["| preset | " + " | ".join(fields) + " |", "|---" * (len(fields) + 1) + "|"]
    p_rows += [f"| `{name}` | " + " | ".join(f"{p[f]:,}" for f in fields) + " |" for name, p in PRESETS.items()]
    return {
        "attentions": "\n".join(a_rows) + "\n",
        "variants": "\n".join(v_rows) + "\n",
        "presets": "\n".join(p_rows) + "\n",
    }


def test_generated_lists_in_design_md_match_the_registry():
    text = DESIGN.read_text()
    want = generated()
    found = {m.group(2): m.group(3) for m in BLOCK.finditer(text)}
    assert set(found) == set(want), f"docs/DESIGN.md needs the generated blocks {sorted(want)}; has {sorted(found)}"
    if os.environ.get("COUPLED_QK_UPDATE_DOCS") == "1":
        DESIGN.write_text(BLOCK.sub(lambda m: m.group(1) + want[m.group(2)] + m.group(4), text))
        return
    stale = [name for name in want if found[name] != want[name]]
    assert not stale, (
        f"docs/DESIGN.md: the generated block(s) {stale} are out of date; run "
        "COUPLED_QK_UPDATE_DOCS=1 python -m pytest tests/test_docs_sync.py"
    )


def test_checker_sees_a_stale_block(tmp_path):
    text = "a\n<!-- BEGIN generated: presets -->\n| old |\n<!-- END generated: presets -->\nb\n"
    (m,) = BLOCK.finditer(text)
    assert m.group(2) == "presets" and m.group(3) == "| old |\n" != generated()["presets"]

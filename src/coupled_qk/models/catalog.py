"""The registry as documentation: the generated tables of docs/DESIGN.md (the attentions with their map options, the
named variants, the presets), rewritten by ``python -m coupled_qk.commands.docs_blocks`` (with every other generated
block) and compared with the registry by ``tests/test_docs.py`` and ``tests/test_docs_sync.py``.

A generated block of a markdown file reads ``<!-- BEGIN generated: NAME -->`` ... ``<!-- END generated: NAME -->``
(:data:`BLOCK`); :func:`tables` renders each block from the registry. The tables cover the library's own maps and
scoring rules (their classes are defined in ``coupled_qk``), not third-party plugins. A page documents the maps its
``attentions`` table names (:func:`documented_maps`): a drop-in map added to :mod:`coupled_qk.models.maps` is
correct without being in the tables, and joins them when the page is written again (:func:`write_docs` writes
every map of the package).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path

from coupled_qk.files import write_text_atomic
from coupled_qk.models.config import PRESETS
from coupled_qk.models.registry import (
    ALIASES,
    ATTENTIONS,
    QK_MAPS,
    SCORING_RULES,
    VARIANTS,
    default_variants,
    load_plugins,
)

BLOCK = re.compile(r"(<!-- BEGIN generated: (\w+) -->\n)(.*?)(<!-- END generated: \2 -->)", re.S)
"""A generated block: group 1 its opening line, 2 its name, 3 its contents, 4 its closing line."""

PRESET_FIELDS = ("vocab_size", "block_size", "n_layer", "d_model", "n_heads")
"""The columns of the presets table."""


def _ours(cls: type | None) -> bool:
    return cls is None or cls.__module__.split(".")[0] == "coupled_qk"


def package_maps() -> list[str]:
    """The registered query-key maps whose classes the package defines (the paper's and any drop-in of
    :mod:`coupled_qk.models.maps`), in registration order."""
    load_plugins()
    return [name for name, entry in QK_MAPS.items() if _ours(entry.module)]


def documented_maps(text: str) -> list[str]:
    """The query-key maps that the ``attentions`` block of the markdown ``text`` names (its second column,
    ``\\`name\\` (\\`Class\\`)``), in order of first appearance."""
    block = next((m.group(3) for m in BLOCK.finditer(text) if m.group(2) == "attentions"), "")
    return list(dict.fromkeys(re.findall(r"^\| `\w+` \| `(\w+)` \(", block, re.M)))


def attention_names(maps: Sequence[str]) -> list[str]:
    """The attentions the tables of ``maps`` list: those without a map first, then each map's, in the order of
    ``maps`` (scoring rules of the package only).

    Raises:
        ValueError: a map in ``maps`` that is not registered, naming it and the registered ones.
    """
    load_plugins()
    maps = list(maps)
    unknown = [m for m in maps if m not in QK_MAPS]
    if unknown:
        raise ValueError(f"query-key map(s) {unknown} are not registered; registered: {list(QK_MAPS)}")
    names = [
        n
        for n, a in ATTENTIONS.items()
        if (a.qk_map is None or a.qk_map.name in maps) and _ours(SCORING_RULES[a.scoring].module)
    ]

    def order(name: str) -> int:  # attentions without a map first, then in the order of ``maps``
        qk_map = ATTENTIONS[name].qk_map
        return 0 if qk_map is None else maps.index(qk_map.name) + 1

    return sorted(names, key=order)


def variant_names(attentions: Sequence[str]) -> list[str]:
    """The named variants of ``attentions``: the default set first (:func:`~coupled_qk.models.registry.
    default_variants`, the paper's order), then the others in registration order."""
    defaults = default_variants()
    listed = [n for n in defaults if VARIANTS[n]["attention"] in attentions]
    return listed + [n for n, spec in VARIANTS.items() if spec["attention"] in attentions and n not in defaults]


def _defaults(options: type) -> str:
    return ", ".join(f"`{f.name}={f.default!r}`" for f in dataclasses.fields(options))


def tables(maps: Sequence[str] | None = None) -> dict[str, str]:
    """The markdown of each generated block (``attentions``, ``variants``, ``presets``), from the registry now.

    Args:
        maps: the query-key maps to document (``None``: :func:`package_maps`); the attentions without a map and
            the variants of every documented attention come with them.

    Raises:
        ValueError: a map in ``maps`` that is not registered, naming it and the registered ones.
    """
    names = attention_names(package_maps() if maps is None else maps)
    rows = ["| attention | query-key map (class) | scoring | map options (defaults) |", "|---|---|---|---|"]
    for name in names:
        m = ATTENTIONS[name].qk_map
        rows.append(
            f"| `{name}` | {f'`{m.name}` (`{m.module.__name__}`)' if m else '-'} | {ATTENTIONS[name].scoring} | "
            f"{_defaults(m.options) if m else '-'} |"
        )
    return {"attentions": "\n".join(rows) + "\n", "variants": _variants(names), "presets": _presets()}


def _variants(attentions: list[str]) -> str:
    defaults = default_variants()
    rows = ["| variant | `GPTConfig` overrides | in the default set |", "|---|---|---|"]
    listed = variant_names(attentions)
    for name in listed:
        overrides = ", ".join(f"`{k}={v!r}`" for k, v in VARIANTS[name].items())
        rows.append(f"| `{name}` | {overrides} | {'yes' if name in defaults else 'no'} |")
    aliases = ", ".join(f"`{a}` = `{n}`" for a, n in ALIASES.items() if n in listed)
    return "\n".join(rows + ["", f"Aliases: {aliases}."]) + "\n"


def _presets() -> str:
    rows = ["| preset | " + " | ".join(PRESET_FIELDS) + " |", "|---" * (len(PRESET_FIELDS) + 1) + "|"]
    rows += [f"| `{n}` | " + " | ".join(f"{p[f]:,}" for f in PRESET_FIELDS) + " |" for n, p in PRESETS.items()]
    return "\n".join(rows) + "\n"


def stale_blocks(text: str, maps: Sequence[str] | None = None) -> list[str]:
    """The names of the generated blocks of ``text`` whose contents differ from :func:`tables` (``maps``:
    ``None`` for the maps ``text`` documents, :func:`documented_maps`).

    Raises:
        ValueError: ``text`` lacks one of the blocks, or documents a map that is not registered.
    """
    want = tables(documented_maps(text) if maps is None else maps)
    found = {m.group(2): m.group(3) for m in BLOCK.finditer(text)}
    missing = sorted(set(want) - set(found))
    if missing:
        raise ValueError(f"the generated block(s) {missing} are missing (<!-- BEGIN generated: NAME --> ...)")
    return [name for name in want if found[name] != want[name]]


def write_docs(path: str | Path, maps: Sequence[str] | None = None) -> list[str]:
    """Rewrite the generated blocks of the markdown file ``path`` from the registry (``maps``: ``None`` for every
    map of the package, :func:`package_maps`); the rest of the file is kept. Written atomically, and only when
    something changed.

    Returns:
        The names of the blocks that changed.

    Raises:
        FileNotFoundError: no file at ``path``. ValueError: the file lacks a generated block (naming it).
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    maps = package_maps() if maps is None else list(maps)
    changed = stale_blocks(text, maps)
    if changed:
        want = tables(maps)
        write_text_atomic(path, BLOCK.sub(lambda m: m.group(1) + want.get(m.group(2), m.group(3)) + m.group(4), text))
    return changed

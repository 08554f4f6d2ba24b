"""docs/DESIGN.md's promise, checked on its own example: "Adding an attention variant: one file, one registration".

The ``Drift`` example is copied out of docs/DESIGN.md verbatim into a file of a temporary folder that is added to
the drop-in package ``coupled_qk.models.maps`` (as if pasted into ``src/coupled_qk/models/maps/``), and the tests
that loop over the registry run on it in a fresh pytest process, with the docs checks (every generated block of
README.md and docs/) and the field-declaration checks: all pass with no other edit. The layering rule a file inside
the package obeys is checked on it here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_layering import LEVELS, imported_modules, level_of

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "DESIGN.md"

REGISTRY_LOOPS = [
    "tests/layers/test_attention.py",  # causality, fast vs eager, KV-cache parity per attention
    "tests/layers/test_kv_cache.py",
    "tests/models/test_padding.py",
    "tests/models/test_sliding.py",
    "tests/models/test_variants.py",
    "tests/analysis/test_analyze.py",
    "tests/hf/test_models.py",
    "tests/hf/test_hf_contract.py",
    "tests/reliability/test_field_declarations.py",
    "tests/test_docs_sync.py",
    "tests/test_docs.py",
]
"""The test files whose cases loop over the registry (their parametrized cases of the drift attentions and
variants run), plus the docs and declaration checks that read every registered map. (tests/models/
test_field_rules.py loops over every attention inside each case: it would run whole again, for minutes.)"""

SELECTED = " or ".join(
    [
        "drift",  # every parametrized case of the drift attentions, variants and options class
        "grid_is_every_map",  # the map x scoring grid
        "map_options_accept_every_declared_value",
        "generated_lists_in_design_md",  # docs/DESIGN.md needs no regeneration
        "every_generated_block_equals_its_generator",  # no generated block of README.md or docs/ goes stale
    ]
)

DROP_IN_PLUGIN = """
from coupled_qk.models import maps

maps.__path__.append({folder!r})  # the registry finds drift.py here as it would in src/coupled_qk/models/maps/
"""


def design_example() -> str:
    """The first Python block of DESIGN.md's section "Adding an attention variant", verbatim."""
    section = DESIGN.read_text().split("## Adding an attention variant", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "docs/DESIGN.md has no ```python block after '## Adding an attention variant'"
    return match.group(1)


def test_the_example_obeys_the_layering_of_a_file_in_models_maps(tmp_path):
    path = tmp_path / "drift.py"
    path.write_text(design_example())
    imports = imported_modules(path, "coupled_qk.models.maps.drift")
    assert imports, "the example imports nothing from coupled_qk"
    too_high = [m for m in imports if level_of(m) > LEVELS["models"]]
    assert not too_high, f"pasted into models/maps/, the example's imports {too_high} break tests/test_layering.py"


@pytest.mark.slow
def test_the_design_example_pasted_as_a_drop_in_passes_the_registry_tests(tmp_path):
    maps_dir = tmp_path / "maps"
    maps_dir.mkdir()
    (maps_dir / "drift.py").write_text(design_example())
    (tmp_path / "design_drop_in.py").write_text(DROP_IN_PLUGIN.format(folder=str(maps_dir)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT / "src"), str(ROOT)]))
    args = ["-p", "design_drop_in", "-p", "no:cacheprovider", "-q", "-rA", "-k", SELECTED, *REGISTRY_LOOPS]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200
    )
    tail = done.stdout[-6000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    passed = re.findall(r"^PASSED (\S+)", done.stdout, re.M)
    for path in REGISTRY_LOOPS:  # each file ran cases over the pasted map (not zero tests passing vacuously)
        assert any(p.startswith(path) for p in passed), f"{path}: no test ran\n{tail}"
    drift_cases = [p for p in passed if "drift" in p.lower()]
    assert len(drift_cases) >= 40, f"only {len(drift_cases)} cases of the drift map ran\n{tail}"
    for name in ("drift", "drift_differential"):  # both attentions of the map took part
        assert any(re.search(rf"[\[-]{name}[\]-]", p) for p in drift_cases), name

"""Messages (docs/RELIABILITY.md, "Messages"): a damaged file is named by every reader, the project's own files are
not warned about, and no message advises what cannot apply. Before, ``from_pretrained`` on a truncated
``model.safetensors`` raised safetensors' "incomplete metadata, file not fully covered" naming no file, a best
checkpoint's ``state.json`` warned about its own keys, a study's derived split folder warned about its own
``source.txt``, and a small given split was told to raise ``--valid-fraction`` (refused for given splits).
"""

from __future__ import annotations

import json
import re
import shutil
import warnings

import pytest
import reliability_profile  # noqa: F401  (the example budget)
from hypothesis import given
from hypothesis import strategies as st

from coupled_qk.hf.configuration import CoupledQKConfig
from coupled_qk.hf.modeling import CoupledQKForCausalLM

DAMAGE = {
    "cut in half": lambda b: b[: len(b) // 2],
    "empty": lambda b: b"",
    "zeroed": lambda b: b"\0" * len(b),
    "text": lambda b: b"not a model file",
    "one byte short": lambda b: b[:-1],
}


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """A one-file export and a sharded one (``model.safetensors.index.json`` with two shards)."""
    root = tmp_path_factory.mktemp("exports")
    model = CoupledQKForCausalLM(CoupledQKConfig(vocab_size=64, block_size=16, n_layer=2, d_model=32, n_heads=2))
    model.save_pretrained(root / "single")
    model.save_pretrained(root / "sharded", max_shard_size="20KB")
    assert len(list((root / "sharded").glob("*.safetensors"))) > 1
    return root


def _parses(data: bytes) -> bool:
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


def _files(folder):
    return sorted(p.name for p in folder.iterdir() if p.suffix in (".safetensors", ".json"))


@given(layout=st.sampled_from(["single", "sharded"]), damage=st.sampled_from(sorted(DAMAGE)), data=st.data())
def test_every_damaged_file_of_an_export_is_named(exports, tmp_path_factory, layout, damage, data):
    folder = tmp_path_factory.mktemp("copy") / layout
    shutil.copytree(exports / layout, folder)
    name = data.draw(st.sampled_from(_files(folder)), label="file")
    path = folder / name
    path.write_bytes(DAMAGE[damage](path.read_bytes()))
    if name.endswith(".json") and _parses(path.read_bytes()):  # "one byte short" of a file ending in a newline
        CoupledQKForCausalLM.from_pretrained(folder)
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            CoupledQKForCausalLM.from_pretrained(folder)
        except (ValueError, OSError) as exc:
            assert str(path) in str(exc), (name, damage, str(exc))
            return
    assert name == "generation_config.json", (name, damage)  # skipped by transformers: a warning names it
    assert any(str(path) in str(w.message) for w in caught)


def test_a_best_checkpoints_own_state_is_read_without_a_warning(tmp_path):
    from coupled_qk.training.checkpoint_format import BEST_STATE_KEYS, Checkpoint

    state = {"step": 4, "tokens": 10, "metric": "valid/loss", "value": 1.5, "epoch": 0.5}
    best = tmp_path / "best-00000004"  # a best checkpoint's folder: its state is read against its own keys
    best.mkdir()
    (best / "state.json").write_text(json.dumps(state))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Checkpoint(best).state()["value"] == 1.5
    assert set(state) <= set(BEST_STATE_KEYS)


def test_a_small_given_split_is_not_told_to_change_the_split_fractions(tmp_path):
    from coupled_qk.training.config import TrainConfig
    from coupled_qk.training.tasks.lm import LMTask
    from tests.conftest import make_text

    folder = tmp_path / "c"
    folder.mkdir()
    for split, n in (("train", 300), ("valid", 5), ("test", 5)):
        (folder / f"{split}.txt").write_text(make_text(n, len(split)))
    cfg = TrainConfig(corpus=str(folder), tokenizer="bpe-300", max_steps=1, out_dir=str(tmp_path / "run"),
                      cache_dir=str(tmp_path / "cache"), device="cpu")  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        LMTask(cfg, tmp_path / "run")
    said = [str(w.message) for w in caught if "noisy estimate" in str(w.message)]
    assert said and all("fraction" not in m and re.search(r"larger (valid|test) file", m) for m in said), said

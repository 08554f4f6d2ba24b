import os

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis.errors import InvalidArgument

from coupled_qk.training.config import TrainConfig

# pytest-xdist runs one worker per core: one thread each avoids oversubscribing the cores (OpenMP spin-waits
# make oversubscribed PyTorch many times slower)
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else max(1, min(2, os.cpu_count() or 1)))

# Hypothesis judges by the clock too: a per-example deadline (200 ms) and a health check on slow input
# generation. On a loaded 2-core CI machine both fire without any defect (a record generator once took 5 s
# because the machine was busy), so every property test runs without them; what each test checks is unchanged.
# This file is imported twice (by pytest as ``conftest`` and by ``from tests.conftest import ...``): the second
# import must not replace a profile loaded in between (tests/reliability/reliability_profile.py's example budget).
try:
    settings.get_profile("coupled-qk")
except InvalidArgument:
    settings.register_profile("coupled-qk", deadline=None, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("coupled-qk")


WORDS = (
    "the cat sat on the mat while a dog ran in the park and birds sang over green hills near old towns "
    "rivers flow to the sea under bright skies people walk talk read write and think about many things"
).split()


def make_text(n_docs: int, seed: int) -> str:
    import random

    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        docs.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))) + " .")
    return "\n\n".join(docs) + "\n"


def write_corpus(folder, sizes=(300, 20, 20)):
    """Create ``folder`` as a folder corpus: train/valid/test splits of ``sizes`` documents of :func:`make_text`
    (seeds 0, 1, 2); returns it."""
    folder.mkdir()
    for split, n, seed in zip(("train", "valid", "test"), sizes, (0, 1, 2)):
        (folder / f"{split}.txt").write_text(make_text(n, seed))
    return folder


@pytest.fixture
def tiny_corpus(tmp_path):
    """A folder corpus with given train/valid/test splits, written in the test."""
    return write_corpus(tmp_path / "corpus")


@pytest.fixture
def tiny_cfg(tiny_corpus, tmp_path):
    def make(**kw):
        base = dict(
            corpus=str(tiny_corpus),
            tokenizer="bpe-300",
            cache_dir=str(tmp_path / "cache"),
            model=dict(n_layer=1, d_model=32, n_heads=2, block_size=16),
            batch_size=4,
            max_steps=8,
            warmup_steps=2,
            log_interval=1,
            eval_interval=4,
            eval_batches=2,
            out_dir=str(tmp_path / "run"),
            progress=False,
            tensorboard=False,
            lr=3e-3,
        )
        base.update(kw)
        return TrainConfig.from_dict(base)

    return make


@pytest.fixture
def drift(monkeypatch):
    """The drift plugin (tests/plugins/drift, registered through its entry point), undone after the test (a
    fixture here, not in tests/hf/conftest.py: a second conftest module would shadow this one for the tests that
    ``from conftest import ...``)."""
    import sys
    from pathlib import Path

    from coupled_qk.models import registry

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent / "plugins" / "drift"))
    with registry.isolated():
        yield
    sys.modules.pop("coupled_qk_drift", None)

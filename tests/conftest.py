import os

import pytest
import torch

# pytest-xdist runs one worker per core: one thread each avoids oversubscribing the cores (OpenMP spin-waits
# make oversubscribed PyTorch many times slower)
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture
def shared_data():
    """Path of the shared real data (../shared/data); tests needing it skip with the reason if absent."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    env = os.environ.get("COUPLED_QK_DATA")
    path = Path(env) if env else root
    if not path.is_dir():
        pytest.skip(f"shared data not found at {path}")
    return path

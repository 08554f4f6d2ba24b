"""A run's provenance: the SHA-256 of its initial weights (against a byte stream built independently with NumPy) and
the hosts it trained on, kept across a resume and copied into ``results.json``."""

import copy
import hashlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from coupled_qk.training import loop
from coupled_qk.training.loop import train
from coupled_qk.training.provenance import host, note_host, weights_sha256

FLOATS = st.floats(width=32, allow_nan=False, allow_infinity=False)


def reference_sha256(entries) -> str:
    """The documented stream, built from NumPy arrays: per entry in name order, ``name\\0dtype\\0shape\\0`` then the
    little-endian element bytes (this machine's order: x86-64 and arm64 are little-endian)."""
    digest = hashlib.sha256()
    for name, dtype, array in sorted(entries, key=lambda e: e[0]):
        digest.update(f"{name}\0{dtype}\0{tuple(array.shape)}\0".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


class Holder(nn.Module):
    """A module with a float32 weight, a float64 parameter, an int64 buffer and a bool buffer."""

    def __init__(self, w, d, counts, mask):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(w, dtype=torch.float32))
        self.d = nn.Parameter(torch.tensor(d, dtype=torch.float64))
        self.register_buffer("counts", torch.tensor(counts, dtype=torch.int64))
        self.register_buffer("mask", torch.tensor(mask, dtype=torch.bool))


@settings(max_examples=40, deadline=None)
@given(
    w=st.lists(st.lists(FLOATS, min_size=3, max_size=3), min_size=1, max_size=4),
    d=st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=0, max_size=5),
    counts=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=4),
    mask=st.lists(st.booleans(), min_size=1, max_size=6),
)
def test_checksum_equals_the_documented_byte_stream(w, d, counts, mask):
    """For any values, the checksum is SHA-256 of the documented stream (names in sorted order, dtype, shape, the
    elements' bytes), recomputed here from NumPy arrays of the same values."""
    module = Holder(w, d, counts, mask)
    expected = reference_sha256(
        [
            ("w", "torch.float32", np.array(w, dtype="<f4")),
            ("d", "torch.float64", np.array(d, dtype="<f8")),
            ("counts", "torch.int64", np.array(counts, dtype="<i8")),
            ("mask", "torch.bool", np.array(mask, dtype=np.bool_)),
        ]
    )
    assert weights_sha256(module) == expected


def test_checksum_sees_one_bit_a_name_and_a_shape_and_not_the_order_of_registration():
    """One flipped bit, another name or another shape of the same bytes give another checksum; the same tensors
    registered in another order give the same one (entries are read in name order)."""
    torch.manual_seed(0)
    a, b = torch.randn(4, 6), torch.randn(6)
    first, second = nn.Module(), nn.Module()
    first.alpha, first.beta = nn.Parameter(a.clone()), nn.Parameter(b.clone())
    second.beta, second.alpha = nn.Parameter(b.clone()), nn.Parameter(a.clone())
    base = weights_sha256(first)
    assert weights_sha256(second) == base
    flipped = copy.deepcopy(first)
    with torch.no_grad():
        flipped.alpha.view(-1).view(torch.int32)[5] ^= 1  # the last bit of one element
    renamed, reshaped = nn.Module(), nn.Module()
    renamed.alpha, renamed.gamma = nn.Parameter(a.clone()), nn.Parameter(b.clone())
    reshaped.alpha, reshaped.beta = nn.Parameter(a.clone().reshape(6, 4)), nn.Parameter(b.clone())
    assert len({base, weights_sha256(flipped), weights_sha256(renamed), weights_sha256(reshaped)}) == 4


def test_checksum_refuses_what_is_not_a_module():
    with pytest.raises(TypeError, match="module=Tensor: expected a torch.nn.Module"):
        weights_sha256(torch.zeros(2))


def test_host_is_plain_json_and_a_resumed_run_lists_each_host_once_in_order():
    """``host`` holds this process's torch build and thread count; ``note_host`` appends a host only when it differs
    from the last one listed."""
    here = host()
    assert here["torch"] == torch.__version__ and here["threads"] == torch.get_num_threads()
    assert all(isinstance(v, (str, int)) for v in here.values()) and "gpu" not in here
    state = {}
    note_host(state)
    note_host(state)
    assert state["hosts"] == [here]
    elsewhere = {**here, "cpu": "another CPU"}
    state = {"hosts": [elsewhere]}
    note_host(state)
    assert state["hosts"] == [elsewhere, here]


def test_a_run_records_the_checksum_of_the_weights_it_started_from_and_keeps_it_across_a_resume(
    tiny_cfg, tmp_path, monkeypatch
):
    """The checksum in ``results.json`` is that of a copy of the model taken the moment the loop built it (before any
    step); an interrupted and resumed run stores the same one (its first start's, not the resumed weights') and one
    host; another seed starts from other weights."""
    built, real_gpt = [], loop.GPT

    def gpt(model_cfg):
        model = real_gpt(model_cfg)
        built.append(copy.deepcopy(model))
        return model

    monkeypatch.setattr(loop, "GPT", gpt)
    model = dict(n_layer=1, d_model=32, n_heads=2, block_size=16, attention="coupled")
    full = train(tiny_cfg(out_dir=str(tmp_path / "full"), model=model, max_steps=4))
    assert full["initial_weights_sha256"] == weights_sha256(built[0])
    assert full["hosts"] == [host()]
    part = tmp_path / "part"
    train(tiny_cfg(out_dir=str(part), model=model, max_steps=4, stop_after_steps=2))
    resumed = train(tiny_cfg(out_dir=str(part), model=model, max_steps=4, resume=True))
    assert resumed["initial_weights_sha256"] == full["initial_weights_sha256"]
    assert resumed["hosts"] == [host()]
    other = train(tiny_cfg(out_dir=str(tmp_path / "seed1"), model=model, max_steps=4, seed=1))
    assert other["initial_weights_sha256"] == weights_sha256(built[-1]) != full["initial_weights_sha256"]

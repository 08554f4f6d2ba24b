"""MQAR datasets of (L, K) slices: derived seeds, disjoint train/test, cache, leakage warnings."""

from __future__ import annotations

import warnings

import pytest
import torch

from coupled_qk.data.mqar import mqar_batch
from coupled_qk.data.mqar_dataset import MQARSliceSpec, make_mqar_dataset

V = 512


def test_dataset_slices_disjoint_and_cached(tmp_path):
    train = [MQARSliceSpec(64, 4, 300), MQARSliceSpec(128, 8, 200)]
    test = [MQARSliceSpec(64, 4, 100), MQARSliceSpec(128, 8, 50, power_a=0.5)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = make_mqar_dataset(train, test, vocab_size=V, cache_dir=tmp_path)
    assert [s.name for s in ds.train] == ["L64_K4", "L128_K8"]
    assert [(s.seq_len, s.num_kv_pairs, len(s)) for s in ds.test] == [(64, 4, 100), (128, 8, 50)]
    assert all(s.spec.seed is not None for s in ds.train + ds.test)
    assert {s.spec.seed for s in ds.train}.isdisjoint({s.spec.seed for s in ds.test})
    assert all(s.inputs.shape == (len(s), s.seq_len) for s in ds.train + ds.test)
    train_rows = {tuple(r) for r in ds.train[0].inputs.tolist()}
    assert not any(tuple(r) in train_rows for r in ds.test[0].inputs.tolist())
    assert not any(s.from_cache for s in ds.train + ds.test)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 4 and all(f.startswith("mqar_") and f.endswith(".pt") for f in files)

    ds2 = make_mqar_dataset(train, test, vocab_size=V, cache_dir=tmp_path)
    assert all(s.from_cache for s in ds2.train + ds2.test)
    for a, b in zip(ds.train + ds.test, ds2.train + ds2.test):
        assert a.spec == b.spec and torch.equal(a.inputs, b.inputs) and torch.equal(a.labels, b.labels)
    assert sorted(p.name for p in tmp_path.iterdir()) == files  # no temp files left behind

    # a different spec (vocab) misses the cache; a corrupt file is regenerated with a warning
    ds3 = make_mqar_dataset(train[:1], [], vocab_size=V + 2, cache_dir=tmp_path)
    assert not ds3.train[0].from_cache
    (tmp_path / files[0]).write_bytes(b"garbage")
    with pytest.warns(RuntimeWarning, match="regenerating"):
        make_mqar_dataset(train, test, vocab_size=V, cache_dir=tmp_path)


def test_explicit_seed_and_derived_seed_reproducible():
    a = make_mqar_dataset([MQARSliceSpec(64, 4, 50)], [MQARSliceSpec(64, 4, 20)], V, seed=7)
    b = make_mqar_dataset([MQARSliceSpec(64, 4, 50)], [MQARSliceSpec(64, 4, 20)], V, seed=7)
    assert torch.equal(a.test[0].inputs, b.test[0].inputs)
    c = make_mqar_dataset([MQARSliceSpec(64, 4, 50, seed=99)], [], V)
    assert c.train[0].spec.seed == 99
    assert torch.equal(c.train[0].inputs, mqar_batch(50, 64, V, 4, seed=99)[0])


def test_shared_seed_and_leakage_warnings():
    with pytest.warns(UserWarning) as rec:
        make_mqar_dataset([MQARSliceSpec(64, 4, 100, seed=5)], [MQARSliceSpec(64, 4, 100, seed=5)], V)
    messages = " | ".join(str(w.message) for w in rec)
    assert "share seed(s) [5]" in messages and "L64_K4 (seed 5): 100/100" in messages


def test_leakage_detected_without_shared_seed():
    # tiny space (4 keys, 5 values, 2 slots): distinct seeds still collide on exact inputs
    with pytest.warns(UserWarning, match=r"leakage.*L8_K2 \(seed 2\)") as rec:
        make_mqar_dataset([MQARSliceSpec(8, 2, 300, seed=1)], [MQARSliceSpec(8, 2, 200, seed=2)], 10)
    assert not any("share seed" in str(w.message) for w in rec)


def test_invalid_slice_reported_before_generation(tmp_path):
    with pytest.raises(ValueError, match=r"test slice 0 \(L66_K4\).*vocab_size=64"):
        make_mqar_dataset([MQARSliceSpec(32, 4, 10)], [MQARSliceSpec(66, 4, 10)], 64, cache_dir=tmp_path)
    assert not list(tmp_path.iterdir())
    with pytest.raises(ValueError, match="seed"):
        MQARSliceSpec(64, 4, 10, seed=-3)

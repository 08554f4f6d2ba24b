"""MQAR accuracy (Zoology's compute_accuracy): per batch from ids or logits, per slice with an oracle model."""

from __future__ import annotations

import math

import pytest
import torch

from coupled_qk.data.mqar import IGNORE_INDEX, mqar_batch
from coupled_qk.data.mqar_dataset import MQARSliceSpec, make_mqar_dataset
from coupled_qk.training.tasks.mqar_accuracy import evaluate_slices, mqar_accuracy, mqar_correct_total

V, L, K = 512, 64, 4

# ------------------------------------------------------------------------------ accuracy


def test_accuracy_from_preds_and_logits():
    x, y = mqar_batch(10, L, V, K, seed=0)
    preds = torch.where(y == IGNORE_INDEX, torch.zeros_like(y), y)
    assert mqar_accuracy(preds, y) == 1.0
    wrong = preds.clone()
    mask = y != IGNORE_INDEX
    idx = mask.nonzero()[:10]
    wrong[idx[:, 0], idx[:, 1]] = 0
    assert mqar_correct_total(wrong, y) == (30, 40)
    assert mqar_accuracy(wrong, y) == pytest.approx(0.75)
    logits = torch.nn.functional.one_hot(wrong, V).float()
    assert mqar_accuracy(logits, y) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="no supervised"):
        mqar_accuracy(preds, torch.full_like(y, IGNORE_INDEX))
    with pytest.raises(ValueError, match="shape"):
        mqar_accuracy(preds[:, :-1], y)


class _Predictor(torch.nn.Module):
    """Logits ``scale * one_hot(predict(x))`` of an id-predicting function (a model for evaluate_slices)."""

    def __init__(self, predict, scale: float = 10.0):
        super().__init__()
        self.predict, self.scale, self.calls = predict, scale, []

    def forward(self, x):
        self.calls.append(tuple(x.shape))
        return torch.nn.functional.one_hot(self.predict(x), V).float() * self.scale


def test_accuracy_by_slice_with_oracle():
    ds = make_mqar_dataset([], [MQARSliceSpec(32, 2, 40, seed=0), MQARSliceSpec(64, 4, 30, seed=1)], V)

    def oracle(inputs: torch.Tensor) -> torch.Tensor:
        """Looks each token up in the prefix pairs; perfect on MQAR."""
        out = torch.zeros_like(inputs)
        k = (inputs[:, 1::2] >= V // 2).cumprod(1).sum(1)  # prefix length in pairs
        for n in range(inputs.shape[0]):
            kk = int(k[n])
            table = dict(zip(inputs[n, 0 : 2 * kk : 2].tolist(), inputs[n, 1 : 2 * kk : 2].tolist()))
            out[n] = torch.tensor([table.get(t, 0) for t in inputs[n].tolist()])
        return out

    names = [s.name for s in ds.test]
    model = _Predictor(oracle)
    model.train()
    res = evaluate_slices(model, ds.test, names, batch_size=16, device="cpu")
    assert {k: v for k, v in res.items() if "accuracy" in k} == {
        "valid/accuracy": 1.0,
        "valid/accuracy/L32_K2": 1.0,
        "valid/accuracy/L64_K4": 1.0,
    }
    # cross-entropy of logits 10 * one_hot(label): log(1 + (V - 1) e^-10), hand-derived (float32 sums)
    assert res["valid/loss"] == pytest.approx(math.log1p((V - 1) * math.exp(-10.0)), rel=1e-4)
    assert model.training and max(b for b, _ in model.calls) == 16  # mode restored; batches of 16
    zeros = evaluate_slices(_Predictor(torch.zeros_like), ds.test, names, batch_size=16, device="cpu")
    assert zeros["valid/accuracy"] == 0.0
    # first rows only: 5 rows of each slice, micro-averaged over 5 * 2 + 5 * 4 queries
    first = _Predictor(oracle)
    half = evaluate_slices(first, ds.test, names, batch_size=3, device="cpu", max_rows=5, prefix="test")
    assert [b for b, _ in first.calls] == [3, 2, 3, 2]  # 5 rows of each slice in batches of at most 3
    assert half["test/accuracy"] == 1.0 and set(half) == {
        "test/accuracy",
        "test/loss",
        "test/accuracy/L32_K2",
        "test/accuracy/L64_K4",
    }
    with pytest.raises(ValueError, match="1 names for 2 slices"):
        evaluate_slices(model, ds.test, names[:1], batch_size=16, device="cpu")

"""Structural golden checks for the MQAR generator (Zoology iclr24, arXiv:2312.04927)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from coupled_qk.data.mqar import IGNORE_INDEX, mqar_batch, query_slot_probabilities

V, L, K = 512, 64, 4


def _parse(inputs: torch.Tensor, labels: torch.Tensor, k: int):
    """Per example: keys (N,K), values (N,K), query positions ordered by pair index (N,K)."""
    x = inputs.numpy()
    keys, values = x[:, 0 : 2 * k : 2], x[:, 1 : 2 * k : 2]
    qpos = np.full(keys.shape, -1)
    for j in range(k):
        hits = x[:, 2 * k :] == keys[:, j : j + 1]
        assert (hits.sum(1) == 1).all(), "every key must be queried exactly once"
        qpos[:, j] = 2 * k + hits.argmax(1)
    return keys, values, qpos


def _chi2_threshold(df: int, z: float = 3.719) -> float:
    """Wilson-Hilferty upper quantile of chi^2_df (z = 3.719 <-> alpha = 1e-4)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _chi2(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


# ------------------------------------------------------------------------------- structure


def test_shapes_dtypes_vocab_ranges_and_distinctness():
    x, y = mqar_batch(500, L, V, K, seed=1)
    assert x.shape == y.shape == (500, L) and x.dtype == y.dtype == torch.int64
    keys, values, _ = _parse(x, y, K)
    assert ((keys >= 1) & (keys < V // 2)).all()
    assert ((values >= V // 2) & (values < V)).all()
    assert all(len(set(r)) == K for r in keys), "keys distinct within a sequence"
    assert all(len(set(r)) == K for r in values), "Zoology samples values without replacement"


def test_labels_queries_and_filler():
    n = 300
    x, y = mqar_batch(n, L, V, K, seed=2)
    keys, values, qpos = _parse(x, y, K)
    xn, yn = x.numpy(), y.numpy()
    rows = np.arange(n)[:, None]
    # queries sit at even offsets after the prefix, one 2-token slot each
    assert ((qpos - 2 * K) % 2 == 0).all() and (qpos >= 2 * K).all() and (qpos <= L - 2).all()
    # label at the query position is the value paired with that key in the prefix
    assert (yn[rows, qpos] == values).all()
    # ...and -100 everywhere else
    mask = np.zeros_like(yn, dtype=bool)
    mask[rows, qpos] = True
    assert (yn[~mask] == IGNORE_INDEX).all() and (mask.sum(1) == K).all()
    # inputs: prefix, queried keys, and filler 0 everywhere else (value NOT echoed after a query)
    structural = mask.copy()
    structural[:, : 2 * K] = True
    assert (xn[~structural] == 0).all()
    assert (xn[rows, qpos + 1] == 0).all()
    assert (xn[:, -1] == 0).all()  # position L-1 is the second token of the last slot
    assert (qpos == L - 2).any()  # ...whose first token can hold a query


def test_zoology_docstring_layout_small_vocab():
    # Zoology's docstring example uses V=12, L=16, which its own assert (V > L) rejects; V=18:
    # keys in [1, 9), values in [9, 18).
    x, y = mqar_batch(200, 16, 18, 2, seed=3)
    keys, values, qpos = _parse(x, y, 2)
    assert set(np.unique(keys)) == set(range(1, 9)) and set(np.unique(values)) == set(range(9, 18))
    assert (y.numpy()[np.arange(200)[:, None], qpos] == values).all()


def test_full_slot_usage_when_4k_equals_l():
    x, y = mqar_batch(200, 32, 64, 8, seed=4)  # S = K: every slot holds a query
    _, _, qpos = _parse(x, y, 8)
    assert (np.sort(qpos, 1) == np.arange(16, 32, 2)).all()


def test_random_non_queries_keeps_structure():
    x0, y0 = mqar_batch(400, L, V, K, seed=5)
    x1, y1 = mqar_batch(400, L, V, K, random_non_queries=True, seed=5)
    assert torch.equal(y0, y1)
    filler = x0 == 0
    assert torch.equal(x0[~filler], x1[~filler])
    noise = x1[filler]
    assert noise.min() >= 0 and noise.max() < V
    assert (noise != 0).float().mean() > 0.95 and noise.unique().numel() > V // 2


# --------------------------------------------------------------------------- distribution


def test_query_slot_probabilities_formula():
    p = query_slot_probabilities(5, 0.5)
    ref = 0.5 * np.arange(1, 6) ** -0.5
    np.testing.assert_allclose(p, ref / ref.sum())
    np.testing.assert_allclose(query_slot_probabilities(7, 1.0), np.full(7, 1 / 7))


def test_query_slot_distribution_matches_successive_sampling():
    """First and second drawn slots have exact closed forms; inclusion vs numpy's choice().

    Zoology places key j at the j-th slot returned by np.random.choice(S, K, replace=False, p),
    i.e. successive sampling: slot of pair 0 ~ p exactly, slot of pair 1 ~
    q_j = sum_{i != j} p_i p_j / (1 - p_i). A uniform slot distribution (or sorted slots) fails.
    """
    n, a = 20_000, 0.01
    s = (L - 2 * K) // 2
    p = query_slot_probabilities(s, a)
    q2 = np.array([sum(p[i] * p[j] / (1 - p[i]) for i in range(s) if i != j) for j in range(s)])
    assert abs(q2.sum() - 1) < 1e-12

    def slot_counts(power_a: float, seed: int) -> np.ndarray:
        x, y = mqar_batch(n, L, V, K, power_a=power_a, seed=seed)
        _, _, qpos = _parse(x, y, K)
        slots = (qpos - 2 * K) // 2
        return np.stack([np.bincount(slots[:, j], minlength=s) for j in range(K)])

    counts = slot_counts(a, 6)
    thr = _chi2_threshold(s - 1)
    assert _chi2(counts[0], p) < thr
    assert _chi2(counts[1], q2) < thr
    # power: the same statistic rejects uniform slots (Zoology's power_a = 1.0) by a mile
    uniform = slot_counts(1.0, 7)
    assert _chi2(uniform[0], np.full(s, 1 / s)) < thr
    assert _chi2(uniform[0], p) > 50 * thr
    # inclusion frequencies vs an independent Monte-Carlo reference with numpy's own sampler
    m = 20_000
    rs = np.random.RandomState(0)
    ref = np.zeros(s)
    for _ in range(m):
        ref[rs.choice(s, K, replace=False, p=p)] += 1
    f_ours, f_ref = counts.sum(0) / n, ref / m
    se = np.sqrt(f_ours * (1 - f_ours) / n + f_ref * (1 - f_ref) / m)
    assert np.abs(f_ours - f_ref).max() / se.max() < 5
    assert (np.abs(f_ours - f_ref) < 5 * se).all()
    f_unif = uniform.sum(0) / n
    assert np.abs(f_unif - f_ref)[0] > 20 * se[0]


# ------------------------------------------------------------------------------ seeding


def test_seed_reproducibility_and_difference():
    a = mqar_batch(100, L, V, K, seed=11, random_non_queries=True)
    b = mqar_batch(100, L, V, K, seed=11, random_non_queries=True)
    c = mqar_batch(100, L, V, K, seed=12, random_non_queries=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    from_generator = mqar_batch(100, L, V, K, seed=np.random.default_rng(11), random_non_queries=True)
    assert torch.equal(from_generator[0], a[0])


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        (dict(input_seq_len=63), "input_seq_len=63"),
        (dict(vocab_size=64), "vocab_size=64"),
        (dict(num_kv_pairs=17), "num_kv_pairs=17"),
        (dict(num_examples=0), "num_examples=0"),
        (dict(num_kv_pairs=0), "num_kv_pairs=0"),
        (dict(power_a=0.0), "power_a=0.0"),
        (dict(power_a=float("nan")), "power_a=nan"),
        (dict(num_examples=2.0), "num_examples=2.0"),
        (dict(seed=-1), "seed=-1"),
    ],
)
def test_invalid_settings_raise(kwargs, needle):
    args = dict(num_examples=4, input_seq_len=L, vocab_size=V, num_kv_pairs=K) | kwargs
    with pytest.raises(ValueError, match=needle.replace(".", r"\.")):
        mqar_batch(**args)


def test_too_few_keys_is_named():
    # With V > L and 4K <= L there are always enough keys, so this check can only fire alongside
    # the others; the message still names it.
    with pytest.raises(ValueError, match=r"num_kv_pairs=8 exceeds the 4 distinct keys"):
        mqar_batch(4, 32, 10, 8)

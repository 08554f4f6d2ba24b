"""Multi-query associative recall (MQAR) data, following Zoology.

Source: Arora, Eyuboglu et al., "Zoology: Measuring and Improving Recall in Efficient
Language Models", arXiv:2312.04927; reference generator ``multiquery_ar`` in
``zoology/data/associative_recall.py`` of HazyResearch/zoology (tag ``iclr24``).  This is an
independent, vectorised re-implementation with the same distribution (not the same random
stream: Zoology seeds NumPy's legacy global RNG and uses ``apply_along_axis``).

Layout of one example (``L = input_seq_len``, ``K = num_kv_pairs``, ``V = vocab_size``)::

    position:  0   1   2   3  ...  2K-2 2K-1 | 2K ... L-1
    inputs:    k1  v1  k2  v2 ...  kK   vK   | queries in 2-token slots, filler 0 elsewhere
    labels:   -100 everywhere except at a query position, where the label is the value
              paired with the queried key in the prefix

* keys are ``K`` distinct tokens from ``[1, V // 2)``; values are ``K`` distinct tokens from
  ``[V // 2, V)`` (Zoology samples both *without* replacement); token 0 is the filler;
* the ``S = (L - 2K) // 2`` slots after the prefix start at ``2K + 2 * g`` (``g = 0 .. S-1``);
  ``K`` slots are drawn without replacement (successive sampling) with weights
  ``p_g ∝ (g + 1) ** (power_a - 1)`` and the key of pair ``j`` is placed in the ``j``-th drawn
  slot, so every key is queried exactly once and queries cluster right after the prefix;
* next-token convention: Zoology builds length ``L + 1`` arrays in which the value sits in the
  *label* array one step after its query key, then returns ``inputs = seq[:-1]`` and
  ``labels = labels[1:]``.  The value is never written into the *input* after a query (the
  next input token is filler); the last slot starts at ``L - 2``, so position ``L - 1`` is
  always filler;
* ``random_non_queries=True`` replaces every filler position (including the position right
  after each query) with a uniform token from ``[0, V)`` - these may collide with keys,
  values or 0, exactly as in Zoology.

Zoology trains on several (L, K) segments, each generated separately with its own seed and
batched separately (batches never mix lengths): :mod:`coupled_qk.data.mqar_dataset` builds such
slices (with a cache) from this generator; :class:`coupled_qk.training.tasks.mqar.MQARTask` batches
them and scores accuracy.
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["IGNORE_INDEX", "mqar_batch", "query_slot_probabilities"]

IGNORE_INDEX = -100
"""Label value ignored by the loss and the accuracy (Zoology / ``nn.CrossEntropyLoss`` default)."""

GENERATOR_VERSION = "coupled_qk.mqar/v1"  # bump when the sampling code changes (invalidates caches)
MAX_SEED = 2**32


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------


def is_int(x: object) -> bool:
    """Whether ``x`` is a Python or NumPy integer (``bool`` is not)."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def check_types(**ints: object) -> None:
    """``ValueError`` listing every keyword argument that is not an integer (see :func:`is_int`)."""
    bad = [f"{name}={value!r} (type {type(value).__name__})" for name, value in ints.items() if not is_int(value)]
    if bad:
        raise ValueError("MQAR: expected integer arguments, got " + ", ".join(bad))


def validate_mqar_args(
    num_examples: int,
    input_seq_len: int,
    vocab_size: int,
    num_kv_pairs: int,
    power_a: float,
) -> None:
    """Raise one ValueError listing every violated requirement (Zoology asserts the first three)."""
    check_types(
        num_examples=num_examples, input_seq_len=input_seq_len, vocab_size=vocab_size, num_kv_pairs=num_kv_pairs
    )
    problems = []
    if num_examples < 1:
        problems.append(f"num_examples={num_examples} must be >= 1")
    if num_kv_pairs < 1:
        problems.append(f"num_kv_pairs={num_kv_pairs} must be >= 1")
    if input_seq_len < 1 or input_seq_len % 2 != 0:
        problems.append(
            f"input_seq_len={input_seq_len} must be a positive even number "
            "(queries occupy 2-token slots; Zoology asserts input_seq_len % 2 == 0)"
        )
    if vocab_size <= input_seq_len:
        problems.append(
            f"vocab_size={vocab_size} must be > input_seq_len={input_seq_len} "
            "(Zoology asserts vocab_size > input_seq_len)"
        )
    if num_kv_pairs >= 1 and 4 * num_kv_pairs > input_seq_len:
        problems.append(
            f"num_kv_pairs={num_kv_pairs} requires 4 * num_kv_pairs <= input_seq_len, "
            f"got 4 * {num_kv_pairs} = {4 * num_kv_pairs} > {input_seq_len} "
            "(Zoology asserts num_kv_pairs * 4 <= input_seq_len)"
        )
    n_keys = vocab_size // 2 - 1
    if num_kv_pairs >= 1 and num_kv_pairs > n_keys:
        problems.append(
            f"num_kv_pairs={num_kv_pairs} exceeds the {max(n_keys, 0)} distinct keys "
            f"available in [1, vocab_size // 2) for vocab_size={vocab_size}"
        )
    if isinstance(power_a, bool) or not isinstance(power_a, (int, float, np.floating, np.integer)):
        problems.append(f"power_a={power_a!r} must be a real number > 0")
    elif not (math.isfinite(float(power_a)) and float(power_a) > 0):
        problems.append(
            f"power_a={power_a} must be finite and > 0 "
            "(slot weights are power_a * i ** (power_a - 1); 1.0 gives uniform slots)"
        )
    if problems:
        raise ValueError("invalid MQAR setting: " + "; ".join(problems))


def _make_rng(seed: int | np.random.Generator) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    if not is_int(seed) or int(seed) < 0:
        raise ValueError(f"MQAR: seed={seed!r} must be a non-negative int or a numpy Generator")
    return np.random.default_rng(int(seed))


# --------------------------------------------------------------------------------------------
# sampling primitives
# --------------------------------------------------------------------------------------------


def query_slot_probabilities(num_slots: int, power_a: float = 0.01) -> np.ndarray:
    """Zoology's power-law weights over query slots.

    Args:
        num_slots: ``S = (input_seq_len - 2 * num_kv_pairs) // 2``, the number of 2-token slots.
        power_a: exponent ``a``; ``p_i ∝ a * i ** (a - 1)`` for ``i = 1 .. S`` (``a = 1`` is uniform).

    Returns:
        float64 array of shape ``(S,)`` summing to 1; entry ``g`` is the probability that the
        *first* drawn slot is slot ``g`` (the slot starting at input position ``2K + 2g``).

    Raises:
        ValueError: if ``num_slots < 1`` or ``power_a`` is not finite and > 0.

    Source: Zoology iclr24 ``multiquery_ar`` (arXiv:2312.04927).
    """
    if not is_int(num_slots) or num_slots < 1:
        raise ValueError(f"num_slots={num_slots!r} must be an int >= 1")
    if not (math.isfinite(float(power_a)) and float(power_a) > 0):
        raise ValueError(f"power_a={power_a!r} must be finite and > 0")
    p = power_a * np.arange(1, num_slots + 1, dtype=np.float64) ** (power_a - 1)
    return p / p.sum()


def _distinct_uniform(rng: np.random.Generator, n_rows: int, k: int, low: int, high: int) -> np.ndarray:
    """``(n_rows, k)`` int64: per row, k distinct tokens from ``[low, high)`` in uniformly random order.

    Robert Floyd's subset algorithm, vectorised over rows (loop over k), then a per-row shuffle:
    the result is distributed like ``np.random.choice(range(low, high), k, replace=False)``.
    """
    n = high - low
    out = np.empty((n_rows, k), dtype=np.int64)
    for idx, j in enumerate(range(n - k, n)):
        t = rng.integers(0, j + 1, size=n_rows, dtype=np.int64)
        if idx:
            taken = (out[:, :idx] == t[:, None]).any(axis=1)
            t[taken] = j
        out[:, idx] = t
    order = np.argsort(rng.random((n_rows, k)), axis=1)
    return np.take_along_axis(out, order, axis=1) + low


def _successive_sample(rng: np.random.Generator, n_rows: int, k: int, p: np.ndarray) -> np.ndarray:
    """``(n_rows, k)`` int64 slot indices: k draws without replacement with weights p, in draw order.

    Gumbel-top-k: the indices of the k largest ``log p + Gumbel`` in decreasing order have the
    successive-sampling (Plackett-Luce) law, which is also the law of (and the order returned by)
    ``np.random.choice(len(p), k, replace=False, p=p)`` used by Zoology.
    """
    scores = np.log(p)[None, :] + rng.gumbel(size=(n_rows, p.shape[0]))
    if k < p.shape[0]:
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    else:
        top = np.broadcast_to(np.arange(p.shape[0]), (n_rows, k)).copy()
    top_scores = np.take_along_axis(scores, top, axis=1)
    order = np.argsort(-top_scores, axis=1, kind="stable")
    return np.take_along_axis(top, order, axis=1).astype(np.int64, copy=False)


def mqar_batch(
    num_examples: int,
    input_seq_len: int,
    vocab_size: int,
    num_kv_pairs: int,
    power_a: float = 0.01,
    random_non_queries: bool = False,
    seed: int | np.random.Generator = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generate MQAR examples exactly as Zoology's ``multiquery_ar`` does (in distribution).

    Args:
        num_examples: N, number of sequences (>= 1).
        input_seq_len: L, sequence length; even, < vocab_size, >= 4 * num_kv_pairs.
        vocab_size: V; keys come from ``[1, V // 2)``, values from ``[V // 2, V)``, 0 is filler.
        num_kv_pairs: K, key-value pairs per sequence; each key is queried exactly once.
        power_a: power-law exponent of the query-slot distribution, ``p_i ∝ i ** (a - 1)``
            (Zoology default 0.01 clusters queries near the prefix; 1.0 is uniform).
        random_non_queries: if True, every filler position gets a uniform token from
            ``[0, V)`` (Zoology's option; its ``MQARConfig`` defaults to True, the paper's
            figure-2 configs and this function use False).
        seed: non-negative int or a ``numpy.random.Generator`` (consumed in place). The same
            int always gives the same data; the structural tokens do not depend on
            ``random_non_queries`` (filler noise is drawn last).

    Returns:
        ``(inputs, labels)``, both ``torch.int64`` of shape ``(N, L)``. ``inputs[:, :2K]`` is
        ``k1 v1 ... kK vK``; query key ``k_j`` sits at position ``2K + 2 g_j``; ``labels`` is
        ``IGNORE_INDEX`` (-100) except ``labels[n, 2K + 2 g_j] = v_j``. The input token after
        a query is filler, not the value (Zoology's convention).

    Raises:
        ValueError: naming the argument, its value and the requirement, for a non-integer or
            non-positive size, odd ``input_seq_len``, ``vocab_size <= input_seq_len``,
            ``4 * num_kv_pairs > input_seq_len``, too few keys, ``power_a`` not finite > 0, or
            a bad seed.

    Source: Zoology iclr24, ``zoology/data/associative_recall.py::multiquery_ar``
    (arXiv:2312.04927).
    """
    validate_mqar_args(num_examples, input_seq_len, vocab_size, num_kv_pairs, power_a)
    rng = _make_rng(seed)
    n, length, vocab, k = int(num_examples), int(input_seq_len), int(vocab_size), int(num_kv_pairs)
    context = 2 * k
    half = vocab // 2

    keys = _distinct_uniform(rng, n, k, 1, half)
    values = _distinct_uniform(rng, n, k, half, vocab)
    p = query_slot_probabilities((length - context) // 2, float(power_a))
    slots = _successive_sample(rng, n, k, p)  # (n, k): slot of the query for pair j
    query_pos = context + 2 * slots

    inputs = np.zeros((n, length), dtype=np.int64)
    inputs[:, 0:context:2] = keys
    inputs[:, 1:context:2] = values
    np.put_along_axis(inputs, query_pos, keys, axis=1)
    labels = np.full((n, length), IGNORE_INDEX, dtype=np.int64)
    np.put_along_axis(labels, query_pos, values, axis=1)

    if random_non_queries:
        filler = inputs == 0  # keys and values are never 0, so this is exactly the filler
        inputs[filler] = rng.integers(0, vocab, size=int(filler.sum()), dtype=np.int64)
    return torch.from_numpy(inputs), torch.from_numpy(labels)

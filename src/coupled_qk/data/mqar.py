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
batched separately (batches never mix lengths); this module mirrors that with
:class:`MQARSlice` objects instead of padding and concatenating.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from coupled_qk.io import atomic_write

__all__ = [
    "IGNORE_INDEX",
    "MQARConfig",
    "MQARDataset",
    "MQARSlice",
    "MQARSplit",
    "iter_mqar_batches",
    "make_mqar_dataset",
    "mqar_accuracy",
    "mqar_accuracy_by_slice",
    "mqar_batch",
    "mqar_correct_total",
    "query_slot_probabilities",
]

IGNORE_INDEX = -100
"""Label value ignored by the loss and the accuracy (Zoology / ``nn.CrossEntropyLoss`` default)."""

_GENERATOR_VERSION = "coupled_qk.mqar/v1"  # bump when the sampling code changes (invalidates caches)
_MAX_SEED = 2**32


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _check_types(**ints: object) -> None:
    bad = [f"{name}={value!r} (type {type(value).__name__})" for name, value in ints.items()
           if not _is_int(value)]
    if bad:
        raise ValueError("MQAR: expected integer arguments, got " + ", ".join(bad))


def _validate(
    num_examples: int,
    input_seq_len: int,
    vocab_size: int,
    num_kv_pairs: int,
    power_a: float,
) -> None:
    """Raise one ValueError listing every violated requirement (Zoology asserts the first three)."""
    _check_types(num_examples=num_examples, input_seq_len=input_seq_len, vocab_size=vocab_size,
                 num_kv_pairs=num_kv_pairs)
    problems = []
    if num_examples < 1:
        problems.append(f"num_examples={num_examples} must be >= 1")
    if num_kv_pairs < 1:
        problems.append(f"num_kv_pairs={num_kv_pairs} must be >= 1")
    if input_seq_len < 1 or input_seq_len % 2 != 0:
        problems.append(f"input_seq_len={input_seq_len} must be a positive even number "
                        "(queries occupy 2-token slots; Zoology asserts input_seq_len % 2 == 0)")
    if vocab_size <= input_seq_len:
        problems.append(f"vocab_size={vocab_size} must be > input_seq_len={input_seq_len} "
                        "(Zoology asserts vocab_size > input_seq_len)")
    if num_kv_pairs >= 1 and 4 * num_kv_pairs > input_seq_len:
        problems.append(f"num_kv_pairs={num_kv_pairs} requires 4 * num_kv_pairs <= input_seq_len, "
                        f"got 4 * {num_kv_pairs} = {4 * num_kv_pairs} > {input_seq_len} "
                        "(Zoology asserts num_kv_pairs * 4 <= input_seq_len)")
    n_keys = vocab_size // 2 - 1
    if num_kv_pairs >= 1 and num_kv_pairs > n_keys:
        problems.append(f"num_kv_pairs={num_kv_pairs} exceeds the {max(n_keys, 0)} distinct keys "
                        f"available in [1, vocab_size // 2) for vocab_size={vocab_size}")
    if isinstance(power_a, bool) or not isinstance(power_a, (int, float, np.floating, np.integer)):
        problems.append(f"power_a={power_a!r} must be a real number > 0")
    elif not (math.isfinite(float(power_a)) and float(power_a) > 0):
        problems.append(f"power_a={power_a} must be finite and > 0 "
                        "(slot weights are power_a * i ** (power_a - 1); 1.0 gives uniform slots)")
    if problems:
        raise ValueError("invalid MQAR setting: " + "; ".join(problems))


def _make_rng(seed: int | np.random.Generator) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    if not _is_int(seed) or int(seed) < 0:
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
    if not _is_int(num_slots) or num_slots < 1:
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
    _validate(num_examples, input_seq_len, vocab_size, num_kv_pairs, power_a)
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


# --------------------------------------------------------------------------------------------
# datasets of (L, K) slices
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MQARSplit:
    """Specification of one (L, K) slice of MQAR data (Zoology's ``MQARConfig`` segment).

    Attributes:
        seq_len: L (Zoology ``input_seq_len``).
        num_kv_pairs: K.
        num_examples: number of sequences in the slice.
        seed: generator seed; ``None`` lets :func:`make_mqar_dataset` derive one Zoology-style
            (train seeds from ``[0, 2**31)``, test seeds from ``[2**31, 2**32)``).
        power_a: query-slot power-law exponent (Zoology ``power_a``, default 0.01).
        random_non_queries: random filler tokens instead of 0 (see :func:`mqar_batch`).

    Raises:
        ValueError: on non-integer or negative fields (vocabulary-dependent checks happen at
            generation time).
    """

    seq_len: int
    num_kv_pairs: int
    num_examples: int
    seed: int | None = None
    power_a: float = 0.01
    random_non_queries: bool = False

    def __post_init__(self) -> None:
        _check_types(seq_len=self.seq_len, num_kv_pairs=self.num_kv_pairs,
                     num_examples=self.num_examples)
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= int(self.seed) < _MAX_SEED):
            raise ValueError(f"MQARSplit: seed={self.seed!r} must be None or an int in [0, 2**32)")
        if not isinstance(self.random_non_queries, bool):
            raise ValueError(f"MQARSplit: random_non_queries={self.random_non_queries!r} must be a bool")

    @property
    def name(self) -> str:
        """Short slice label, e.g. ``"L256_K16"``."""
        return f"L{self.seq_len}_K{self.num_kv_pairs}"

    def to_dict(self) -> dict:
        """Plain-JSON dict of all fields (used for cache keys)."""
        d = dataclasses.asdict(self)
        d["power_a"] = float(d["power_a"])
        return {key: (int(v) if _is_int(v) else v) for key, v in d.items()}


MQARConfig = MQARSplit
"""Alias of :class:`MQARSplit` (Zoology calls a segment spec ``MQARConfig``)."""


@dataclass
class MQARSlice:
    """One generated (L, K) slice.

    Attributes:
        spec: the :class:`MQARSplit` with its seed resolved (never ``None``).
        vocab_size: V.
        inputs: ``torch.int64`` of shape ``(num_examples, seq_len)``.
        labels: ``torch.int64`` of shape ``(num_examples, seq_len)``, -100 off queries.
        from_cache: True when loaded from the on-disk cache.
    """

    spec: MQARSplit
    vocab_size: int
    inputs: torch.Tensor
    labels: torch.Tensor
    from_cache: bool = False

    @property
    def seq_len(self) -> int:
        return self.spec.seq_len

    @property
    def num_kv_pairs(self) -> int:
        return self.spec.num_kv_pairs

    @property
    def name(self) -> str:
        return self.spec.name

    def __len__(self) -> int:
        return int(self.inputs.shape[0])


@dataclass
class MQARDataset:
    """Train and test slices produced by :func:`make_mqar_dataset` (never mixed or padded)."""

    train: list[MQARSlice]
    test: list[MQARSlice]
    vocab_size: int


def _cache_key(spec: MQARSplit, vocab_size: int) -> str:
    payload = {"generator": _GENERATOR_VERSION, "vocab_size": int(vocab_size), **spec.to_dict()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


def _build_slice(spec: MQARSplit, vocab_size: int, cache_dir: Path | None) -> MQARSlice:
    path = cache_dir / f"mqar_{_cache_key(spec, vocab_size)}.pt" if cache_dir is not None else None
    if path is not None and path.exists():
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
            inputs, labels = blob["inputs"], blob["labels"]
            expected = (spec.num_examples, spec.seq_len)
            if (blob.get("spec") != spec.to_dict() or blob.get("vocab_size") != vocab_size
                    or tuple(inputs.shape) != expected or tuple(labels.shape) != expected
                    or inputs.dtype != torch.int64 or labels.dtype != torch.int64):
                raise ValueError("cached content does not match the requested spec")
            return MQARSlice(spec, vocab_size, inputs, labels, from_cache=True)
        except Exception as exc:  # corrupt / stale file: regenerate and overwrite
            warnings.warn(f"MQAR cache file {path} unreadable or stale ({exc}); regenerating it",
                          RuntimeWarning, stacklevel=3)
    inputs, labels = mqar_batch(spec.num_examples, spec.seq_len, vocab_size, spec.num_kv_pairs,
                                power_a=spec.power_a, random_non_queries=spec.random_non_queries,
                                seed=int(spec.seed))
    if path is not None:
        payload = {"inputs": inputs, "labels": labels, "spec": spec.to_dict(),
                   "vocab_size": int(vocab_size), "generator": _GENERATOR_VERSION}
        atomic_write(path, lambda f: torch.save(payload, f))
    return MQARSlice(spec, vocab_size, inputs, labels, from_cache=False)


def _row_hashes(x: np.ndarray) -> np.ndarray:
    """Vectorised 64-bit per-row hash (collisions are re-checked exactly by the caller)."""
    coeffs = np.random.default_rng(0x5EED).integers(1, 2**63, size=x.shape[1], dtype=np.uint64) | 1
    with np.errstate(over="ignore"):
        mixed = (x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)) * coeffs[None, :]
        mixed ^= mixed >> np.uint64(29)
        return mixed.sum(axis=1, dtype=np.uint64)


def _count_leaked(train: Sequence[MQARSlice], test_slice: MQARSlice) -> int:
    """Number of rows of ``test_slice.inputs`` that appear exactly in some train slice."""
    test_x = test_slice.inputs.numpy()
    test_h = _row_hashes(test_x)
    leaked = np.zeros(len(test_x), dtype=bool)
    for tr in train:
        if tr.seq_len != test_slice.seq_len:
            continue
        train_x = tr.inputs.numpy()
        train_h = _row_hashes(train_x)
        candidates = np.flatnonzero(np.isin(test_h, train_h) & ~leaked)
        if candidates.size == 0:
            continue
        by_hash: dict[int, list[int]] = {}
        for i in np.flatnonzero(np.isin(train_h, test_h[candidates])):
            by_hash.setdefault(int(train_h[i]), []).append(int(i))
        for c in candidates:
            if any(np.array_equal(test_x[c], train_x[i]) for i in by_hash.get(int(test_h[c]), ())):
                leaked[c] = True
    return int(leaked.sum())


def make_mqar_dataset(
    train_specs: Sequence[MQARSplit],
    test_specs: Sequence[MQARSplit],
    vocab_size: int,
    cache_dir: str | os.PathLike | None = None,
    seed: int = 123,
    check_leakage: bool = True,
) -> MQARDataset:
    """Generate (or load from cache) train and test MQAR slices, Zoology ``prepare_data`` style.

    Each spec becomes its own :class:`MQARSlice` (Zoology builds every segment separately and
    batches segments separately, so slices are not padded or concatenated). Specs with
    ``seed=None`` get Zoology-style derived seeds: ``numpy.random.default_rng(seed)`` draws
    train seeds from ``[0, 2**31)`` and test seeds from ``[2**31, 2**32)``, so derived train
    and test seeds never coincide.

    Args:
        train_specs: slices to train on (may be empty).
        test_specs: slices to evaluate on (may be empty).
        vocab_size: V shared by every slice.
        cache_dir: if given, each slice is stored as ``mqar_<hash>.pt`` (``torch.save``; hash
            of the generator version, V and the full resolved spec), written atomically via a
            temp file + ``os.replace``; existing matching files are loaded instead of
            regenerated (``MQARSlice.from_cache``).
        seed: master seed for derived per-slice seeds (Zoology ``DataConfig.seed`` = 123).
        check_leakage: hash every test row and warn if its exact ``inputs`` occur in a train
            slice of the same length.

    Returns:
        :class:`MQARDataset` with ``train`` / ``test`` lists of slices in spec order.

    Warns:
        UserWarning: when a train and a test slice share a seed, or when any test sequence
            also appears in the train data (with counts per test slice).

    Raises:
        ValueError: for non-``MQARSplit`` specs, a bad ``seed``, or any invalid slice setting
            (see :func:`mqar_batch`); all slices are validated before anything is generated.

    Source: Zoology iclr24 ``zoology/data/utils.py::prepare_data`` and ``DataSegment.from_config``
    (arXiv:2312.04927).
    """
    train_specs, test_specs = list(train_specs), list(test_specs)
    for role, specs in (("train_specs", train_specs), ("test_specs", test_specs)):
        for i, s in enumerate(specs):
            if not isinstance(s, MQARSplit):
                raise ValueError(f"{role}[{i}] must be an MQARSplit, got {type(s).__name__}")
    if not _is_int(seed) or int(seed) < 0:
        raise ValueError(f"make_mqar_dataset: seed={seed!r} must be a non-negative int")
    _check_types(vocab_size=vocab_size)

    master = np.random.default_rng(int(seed))
    train_seeds = master.integers(0, _MAX_SEED // 2, size=len(train_specs))
    test_seeds = master.integers(_MAX_SEED // 2, _MAX_SEED, size=len(test_specs))
    train_specs = [s if s.seed is not None else dataclasses.replace(s, seed=int(d))
                   for s, d in zip(train_specs, train_seeds)]
    test_specs = [s if s.seed is not None else dataclasses.replace(s, seed=int(d))
                  for s, d in zip(test_specs, test_seeds)]
    for role, specs in (("train", train_specs), ("test", test_specs)):
        for i, s in enumerate(specs):
            try:
                _validate(s.num_examples, s.seq_len, vocab_size, s.num_kv_pairs, s.power_a)
            except ValueError as exc:
                raise ValueError(f"{role} slice {i} ({s.name}): {exc}") from None

    shared = sorted({s.seed for s in train_specs} & {s.seed for s in test_specs})
    if shared:
        warnings.warn(f"MQAR: train and test slices share seed(s) {shared}; slices with the same "
                      "seed and (L, K) settings are identical, so the test set may leak into train",
                      UserWarning, stacklevel=2)

    cache_path = None
    if cache_dir is not None:
        cache_path = Path(cache_dir)
        cache_path.mkdir(parents=True, exist_ok=True)
    train = [_build_slice(s, int(vocab_size), cache_path) for s in train_specs]
    test = [_build_slice(s, int(vocab_size), cache_path) for s in test_specs]

    if check_leakage and train and test:
        report = []
        for t in test:
            n_leaked = _count_leaked(train, t)
            if n_leaked:
                report.append(f"{t.name} (seed {t.spec.seed}): {n_leaked}/{len(t)} "
                              f"({n_leaked / len(t):.2%})")
        if report:
            warnings.warn("MQAR data leakage: test sequences whose exact inputs also appear in the "
                          "train data: " + "; ".join(report), UserWarning, stacklevel=2)
    return MQARDataset(train=train, test=test, vocab_size=int(vocab_size))


def iter_mqar_batches(
    slices: Sequence[MQARSlice],
    batch_size: int,
    shuffle: bool = False,
    seed: int = 0,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, MQARSlice]]:
    """Yield ``(inputs, labels, slice)`` batches that never mix slices (Zoology's batching).

    Args:
        slices: slices to iterate, e.g. ``dataset.train``.
        batch_size: rows per batch (the last batch of a slice may be smaller).
        shuffle: if True, shuffle rows within each slice and the order of all batches
            (Zoology iclr24 iterates segments in order without shuffling; shuffling is the
            usual choice for training when slices differ in length).
        seed: seed of the shuffling permutation.

    Yields:
        ``inputs``/``labels`` ``torch.int64`` of shape ``(B, L_slice)`` and the source slice.

    Raises:
        ValueError: if ``batch_size`` is not a positive int.
    """
    if not _is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive int")
    gen = torch.Generator().manual_seed(int(seed))
    plan = []
    for si, s in enumerate(slices):
        rows = torch.randperm(len(s), generator=gen) if shuffle else torch.arange(len(s))
        plan.extend((si, rows[b:b + batch_size]) for b in range(0, len(s), batch_size))
    order = torch.randperm(len(plan), generator=gen).tolist() if shuffle else range(len(plan))
    for j in order:
        si, rows = plan[j]
        s = slices[si]
        yield s.inputs[rows], s.labels[rows], s


# --------------------------------------------------------------------------------------------
# accuracy
# --------------------------------------------------------------------------------------------


def _predictions(logits_or_preds: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    if not isinstance(logits_or_preds, torch.Tensor) or not isinstance(labels, torch.Tensor):
        raise ValueError("mqar accuracy expects torch tensors for predictions and labels")
    if logits_or_preds.dim() == labels.dim() + 1 and logits_or_preds.shape[:-1] == labels.shape:
        return logits_or_preds.argmax(dim=-1)
    if logits_or_preds.shape == labels.shape:
        if logits_or_preds.is_floating_point():
            raise ValueError("predictions with the labels' shape must be integer token ids, got "
                             f"dtype {logits_or_preds.dtype}; pass logits with a trailing vocab dim")
        return logits_or_preds
    raise ValueError(f"prediction shape {tuple(logits_or_preds.shape)} matches neither labels "
                     f"{tuple(labels.shape)} (token ids) nor labels + (vocab,) (logits)")


def mqar_correct_total(
    logits_or_preds: torch.Tensor, labels: torch.Tensor, ignore_index: int = IGNORE_INDEX
) -> tuple[int, int]:
    """Count argmax-correct supervised positions.

    Args:
        logits_or_preds: logits ``(..., V)`` (float) or predicted ids with ``labels``' shape.
        labels: int tensor ``(...)``, ``ignore_index`` off the query positions.
        ignore_index: label value to skip (default -100).

    Returns:
        ``(correct, total)`` Python ints over positions with ``labels != ignore_index``.

    Raises:
        ValueError: on mismatched shapes or float predictions without a vocab dimension.
    """
    preds = _predictions(logits_or_preds, labels)
    mask = labels != ignore_index
    correct = (preds.to(labels.device) == labels) & mask
    return int(correct.sum().item()), int(mask.sum().item())


def mqar_accuracy(
    logits_or_preds: torch.Tensor, labels: torch.Tensor, ignore_index: int = IGNORE_INDEX
) -> float:
    """Fraction of supervised (query) positions whose argmax prediction equals the label.

    Same metric as Zoology's ``compute_accuracy`` (micro-average over all query positions).

    Args:
        logits_or_preds: logits ``(..., V)`` or predicted ids with ``labels``' shape.
        labels: int tensor, ``ignore_index`` (-100) off the query positions.
        ignore_index: label value to skip.

    Returns:
        Accuracy in ``[0, 1]`` as a Python float.

    Raises:
        ValueError: on shape mismatch, or if no position is supervised.
    """
    correct, total = mqar_correct_total(logits_or_preds, labels, ignore_index)
    if total == 0:
        raise ValueError("mqar_accuracy: labels contain no supervised positions (all == ignore_index)")
    return correct / total


@torch.no_grad()
def mqar_accuracy_by_slice(
    predict: Callable[[torch.Tensor], torch.Tensor],
    slices: Sequence[MQARSlice],
    batch_size: int = 256,
    device: torch.device | str | None = None,
) -> dict[str, float]:
    """Evaluate a model on each slice separately and overall.

    Args:
        predict: maps ``inputs`` ``(B, L)`` int64 to logits ``(B, L, V)`` or ids ``(B, L)``
            (e.g. a model in eval mode).
        slices: slices to evaluate, e.g. ``dataset.test``.
        batch_size: rows per forward pass.
        device: where to move inputs before calling ``predict`` (default: leave on CPU).

    Returns:
        ``{slice.name: accuracy, ..., "overall": micro-average over all query positions}``
        (duplicate names get a ``#i`` suffix with the slice index).

    Raises:
        ValueError: if ``slices`` is empty or a batch has mismatched shapes.
    """
    if not slices:
        raise ValueError("mqar_accuracy_by_slice: no slices given")
    out: dict[str, float] = {}
    all_correct = all_total = 0
    names = [s.name for s in slices]
    for i, s in enumerate(slices):
        correct = total = 0
        for inputs, labels, _ in iter_mqar_batches([s], batch_size):
            if device is not None:
                inputs = inputs.to(device)
            c, t = mqar_correct_total(predict(inputs).cpu(), labels)
            correct, total = correct + c, total + t
        name = s.name if names.count(s.name) == 1 else f"{s.name}#{i}"
        out[name] = correct / total if total else float("nan")
        all_correct, all_total = all_correct + correct, all_total + total
    out["overall"] = all_correct / all_total if all_total else float("nan")
    return out

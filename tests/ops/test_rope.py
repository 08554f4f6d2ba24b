"""RoPE (ops/rope.py): the fused rotation against a float64 recomputation of the rotate-half formula, and the
relative-position invariant."""

import math

import pytest
import torch

from coupled_qk.ops.rope import apply_rope, rope_tables, signed_sin


def reference(x, base=10000.0):
    """Rotate-half RoPE recomputed from its definition in float64, position by position, pair by pair."""
    t, d = x.shape[-2], x.shape[-1]
    out = torch.empty_like(x, dtype=torch.float64)
    xd = x.double()
    for pos in range(t):
        for i in range(d // 2):
            theta = pos * base ** (-2 * i / d)
            a, b = xd[..., pos, i], xd[..., pos, i + d // 2]
            out[..., pos, i] = a * math.cos(theta) - b * math.sin(theta)
            out[..., pos, i + d // 2] = b * math.cos(theta) + a * math.sin(theta)
    return out


@pytest.mark.parametrize("precomputed", [False, True])
def test_rotation_matches_the_definition(precomputed):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, 8, dtype=torch.float64)
    cos, sin = rope_tables(6, 8, dtype=torch.float64)
    extra = (signed_sin(sin),) if precomputed else ()
    torch.testing.assert_close(apply_rope(x, cos, sin, *extra), reference(x), rtol=1e-12, atol=1e-12)


def test_signed_sin_negates_the_first_half():
    sin = torch.arange(1.0, 9.0)
    assert signed_sin(sin).tolist() == [-1.0, -2.0, -3.0, -4.0, 5.0, 6.0, 7.0, 8.0]


def test_scores_depend_only_on_the_position_difference():
    torch.manual_seed(1)
    q, k = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    cos, sin = rope_tables(12, 16, dtype=torch.float64)
    rot = lambda v, p: apply_rope(v.view(1, 16), cos[p : p + 1], sin[p : p + 1], signed_sin(sin[p : p + 1]))  # noqa: E731
    s = [(rot(q, p + 3) * rot(k, p)).sum().item() for p in range(8)]
    assert s == pytest.approx([s[0]] * 8, rel=1e-12, abs=1e-12)


def test_bf16_input_keeps_its_dtype():
    cos, sin = rope_tables(4, 8)
    x = torch.randn(1, 1, 4, 8, dtype=torch.bfloat16)
    assert apply_rope(x, cos, sin, signed_sin(sin)).dtype == torch.bfloat16

"""A third-party attention variant, registered only through the ``coupled_qk.variants`` entry point.

The toy map ``drift``: ``q' = q + gain * dt * k``, ``k' = k`` (one learned ``dt`` per head, a fixed ``gain``),
the first half of the paper's Euler step without the force on the key (arXiv:2604.01683v1, section 3). It is
a test fixture: ``tests/test_plugin_variant.py`` puts this folder on ``sys.path``, where
``coupled_qk_drift-0.1.dist-info/entry_points.txt`` makes it an installed distribution, and checks that every
command sees the variant without any edit to ``src/``. ``pyproject.toml`` here shows how a real package would
declare the same entry point.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

from coupled_qk import MapOptions, QKMap, option, register_qk_map, register_variant


class Drift(QKMap):
    """``(q, k) -> (q + gain * dt_h * k, k)`` per head ``h``.

    Args:
        d_head: head width.
        n_heads: query heads ``H`` (one learned ``dt`` per head).
        gain: fixed factor on the drift (finite).
        dt_init: initial ``dt`` of every head.

    Shapes: ``q`` and ``k`` of shape ``(B, H, T, d_head)`` (``keys_per_query_head``: the layer repeats grouped
    keys to one per query head); returns the same shapes and dtypes.
    """

    keys_per_query_head = True
    query_update_is_shift = True  # q' = q + gain dt k: retrofit(gqa="shared") is exact for it

    def __init__(self, d_head: int, n_heads: int, gain: float = 1.0, dt_init: float = 0.1):
        super().__init__()
        self.gain = gain
        self.dt = nn.Parameter(torch.full((n_heads,), float(dt_init)))

    def start_at_identity(self) -> None:
        """``dt = 0``: the map is the identity (what ``coupled_qk.hf.retrofit(qk_map="drift")`` needs)."""
        nn.init.zeros_(self.dt)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dt = self.dt.to(q.dtype).view(1, -1, 1, 1)
        return q + self.gain * dt * k, k


@dataclasses.dataclass
class DriftOptions(MapOptions):
    """Options of :class:`Drift`: ``gain`` (finite) and ``dt_init`` (finite)."""

    gain: float = option(1.0)  # any finite number
    dt_init: float = option(0.1)


def register() -> None:
    """The entry point: one map (attentions ``drift`` and ``drift_differential``) and one named variant."""
    register_qk_map("drift", "drift", Drift, DriftOptions)
    register_variant("drift_strong", "drift", gain=4.0, in_defaults=False)

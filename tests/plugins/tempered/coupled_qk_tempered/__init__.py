"""A third-party scoring rule, registered only through the ``coupled_qk.variants`` entry point.

The toy rule ``tempered``: softmax attention at a fixed temperature ``0.5``,
``softmax(q k^T / (0.5 sqrt(d))) V`` (sharper than the standard rule). It is a test fixture:
``tests/test_plugin_variant.py`` puts this folder on ``sys.path``, where
``coupled_qk_tempered-0.1.dist-info/entry_points.txt`` makes it an installed distribution, and checks that the
rule works alone (attention ``tempered``) and under every registered query-key map (``coupled_tempered``, ...)
without any edit to ``src/``.
"""

from __future__ import annotations

import torch

from coupled_qk import ScoringRule, register_scoring, scaled_dot_product

TEMPERATURE = 0.5


class Tempered(ScoringRule):
    """``softmax(q k^T / (T sqrt(d))) V`` with a fixed temperature ``T`` (no parameters).

    Args:
        d_head, n_heads, layer_idx: the layer's shape and index (unused: the rule is the same in every layer).
        temperature: ``T`` (> 0).

    Shapes: as :class:`coupled_qk.ScoringRule`: ``q (B, H, T_q, d)``, ``k (B, H_k, T_k, d)``, ``v (B, H_v, T_k, d)``
    -> ``(B, H, T_q, d)`` and, when ``eager``, the probabilities ``(B, H, T_q, T_k)``.
    """

    def __init__(self, d_head: int, n_heads: int, layer_idx: int, temperature: float = TEMPERATURE):
        super().__init__()
        self.temperature = temperature

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        eager: bool,
        dropout_p: float = 0.0,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Scaled dot-product attention on queries divided by the temperature."""
        return scaled_dot_product(q / self.temperature, k, v, eager, dropout_p, mask)


def register() -> None:
    """The entry point: one scoring rule (attention ``tempered`` and ``<map stem>_tempered`` for every map)."""
    register_scoring("tempered", Tempered)

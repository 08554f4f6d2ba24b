"""The next-token cross-entropy used by the model, the training loop and the Hugging Face wrapper."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Mean cross-entropy in nats of ``targets`` under ``logits``, computed in float32.

    Args:
        logits: ``(..., V)`` unnormalised scores, any float dtype (converted to float32).
        targets: integer ids with shape ``logits.shape[:-1]``; entries equal to ``ignore_index`` are skipped.

    Returns:
        A scalar tensor (``nan`` when every target is ignored, as ``F.cross_entropy``).

    Source: the standard language-modelling objective (docs/METHOD.md section 5).
    """
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=ignore_index)

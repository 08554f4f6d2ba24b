"""An opt-in decoding head of :class:`~coupled_qk.models.gpt.GPT`: logits of a few rows from a contiguous
transposed copy of the output weights.

At batch 1 a decoding step streams every weight once, and on CPUs with MKL a single-row product in PyTorch's
``(out, in)`` layout streams the output head at about half the speed of the transposed ``(in, out)`` layout
(GPT-2's ``Conv1D``): 6.80 against 3.70 ms for the 60m preset's 50,257 x 512 head, one thread
(``benchmarks/gemv_layout.py``; ``benchmarks/results/fastpath/decode-options/README.md``). The copy costs the
head's memory once more (103 MB at 60m), so it is off unless asked for.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from coupled_qk.checks.values import declared_flags

TRANSPOSED_HEAD_ROWS = 64
"""Largest number of rows (positions x batch) that use the transposed head; above it both layouts measure alike."""


class DecodingHeadMixin:
    """:meth:`use_transposed_head` and the logits path that reads it (a base class of ``GPT``)."""

    lm_head: nn.Linear  # the model's output head (GPT.__init__)
    _head_enabled: bool  # the state use_transposed_head sets (unset: not enabled)
    _head_t: torch.Tensor | None
    _head_key: tuple | None

    @declared_flags
    def use_transposed_head(self, enabled: bool = True) -> None:
        """Compute the logits of up to :data:`TRANSPOSED_HEAD_ROWS` rows without gradients (decoding steps:
        :meth:`next_token_logits`, :meth:`generate`, eager or compiled) as ``hidden @ W^T`` with ``W^T`` a
        contiguous copy of the output head ``(d_model, padded_vocab)``; everything else (training, evaluation of
        long sequences) keeps ``lm_head``. Same logits up to float rounding (the products' summation order
        differs). The copy follows the weights: it is refreshed when the head's storage, version counter (an
        optimizer step), dtype or device changes, checked before each eager step and each compiled step.
        ``enabled=False`` drops the copy. Not saved in ``state_dict``, checkpoints or exports.

        Memory: ``d_model x padded_vocab`` values of the head's dtype (103 MB at the 60m preset in fp32).

        Raises:
            TypeError: ``enabled`` is not a bool; the output head is not a bias-free ``nn.Linear`` (a replaced
                head cannot be transposed this way).
        """
        head = self.lm_head
        if enabled and (not isinstance(head, nn.Linear) or head.bias is not None):
            raise TypeError(f"use_transposed_head needs a bias-free nn.Linear output head; lm_head is {head!r}")
        self._head_enabled, self._head_t, self._head_key = enabled, None, None
        self._refresh_transposed_head()

    def _refresh_transposed_head(self) -> torch.Tensor | None:
        """Rebuild (or refill in place, keeping the tensor a compiled step reads) the transposed copy when the head's
        weights changed since it was made; returns it (``None`` when not enabled)."""
        if not getattr(self, "_head_enabled", False):
            return None
        w = self.lm_head.weight
        key = (w.data_ptr(), w._version, w.dtype, w.device, tuple(w.shape))
        if key != self._head_key:
            with torch.no_grad():
                t = self._head_t
                if t is not None and (t.dtype, t.device, tuple(t.shape)) == (w.dtype, w.device, tuple(w.shape[::-1])):
                    t.copy_(w.t())
                else:
                    self._head_t = w.detach().t().contiguous()
            self._head_key = key
        return self._head_t

    def _transposed_head_for(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """The copy to use for ``hidden (..., d_model)``, or ``None`` (not enabled, gradients on, too many rows)."""
        if not getattr(self, "_head_enabled", False) or torch.is_grad_enabled():
            return None
        if hidden.numel() > TRANSPOSED_HEAD_ROWS * hidden.shape[-1]:
            return None
        if not torch.compiler.is_compiling():  # a compiled step is refreshed by its caller (compiled_decode_step)
            return self._refresh_transposed_head()
        return self._head_t

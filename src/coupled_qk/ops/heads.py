"""Head layouts of grouped-query attention: repeat key/value heads, average query heads per group.

Query (sub-)head ``j`` belongs to key/value (sub-)head ``kv(j)``; with ``n_rep = H / H_kv`` query heads per
key/value head and heads made of ``group`` consecutive sub-heads (``group = 2`` for differential attention,
whose sub-heads ``2i, 2i+1`` form head ``i``), sub-head ``s`` of query head ``i`` uses sub-head ``s`` of
key/value head ``i // n_rep``: ``kv(group*i + s) = group*(i // n_rep) + s``. :func:`expand_kv` and
:func:`group_mean` are the two directions of this map (``group_mean(expand_kv(x)) == x``).
"""

from __future__ import annotations

import torch


def expand_kv(x: torch.Tensor, n_rep: int, group: int = 1) -> torch.Tensor:
    """Repeat key/value heads for grouped-query attention.

    Args:
        x: ``(..., H_kv * group, T, d)``; heads come in consecutive groups of ``group`` sub-heads.
        n_rep: query heads per kv head.
        group: sub-heads per head (1, or 2 for differential attention).

    Returns:
        ``(..., H_kv * n_rep * group, T, d)`` (a copy, or ``x`` itself when ``n_rep == 1``) where query head
        ``i`` (sub-heads ``group*i + s``) sees kv-head ``i // n_rep`` (sub-heads ``group*(i // n_rep) + s``).
    """
    if n_rep == 1:
        return x
    *lead, hg, t, d = x.shape
    x = x.reshape(*lead, hg // group, 1, group, t, d).expand(*lead, hg // group, n_rep, group, t, d)
    return x.reshape(*lead, hg * n_rep, t, d)


def group_mean(x: torch.Tensor, n_rep: int, group: int = 1) -> torch.Tensor:
    """Average the query heads of each key/value group: the adjoint layout of :func:`expand_kv`.

    Args:
        x: ``(..., H * group, T, d)`` per query (sub-)head, or ``(H * group,)`` (e.g. per-head step sizes).
        n_rep: query heads per kv head (divides ``H``).
        group: sub-heads per head.

    Returns:
        ``(..., H / n_rep * group, T, d)`` (or ``(H / n_rep * group,)``): entry ``kv`` is the mean of the query
        sub-heads ``j`` with ``kv(j) == kv`` (see the module docstring); ``x`` itself when ``n_rep == 1``.
    """
    if n_rep == 1:
        return x
    if x.dim() == 1:
        return x.view(-1, n_rep, group).mean(1).reshape(-1)
    *lead, hg, t, d = x.shape
    return x.reshape(*lead, hg // (group * n_rep), n_rep, group, t, d).mean(-4).reshape(*lead, hg // n_rep, t, d)

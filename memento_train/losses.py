"""Losses: completion cross-entropy and the retention KL of stage 2.

Retention: where the memento mask hides something that causal attention would show, keep the
masked model's next-token distribution close to what the model predicts with full (causal)
attention: ``KL(p_full ‖ p_masked)``, on completion tokens whose visible set actually differs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .data import IGNORE
from .masking import visible_until


def completion_ce(logits: torch.Tensor, labels: torch.Tensor, num_items: int | torch.Tensor | None = None):
    """Next-token CE over labelled positions; summed and divided by `num_items` when the Trainer
    gives the count over the whole accumulated batch, else averaged over this batch."""
    shift_logits = logits[:, :-1].float()
    shift_labels = labels[:, 1:]
    total = F.cross_entropy(shift_logits.reshape(-1, shift_logits.shape[-1]), shift_labels.reshape(-1),
                            ignore_index=IGNORE, reduction="sum")  # fmt: skip
    count = num_items if num_items is not None else (shift_labels != IGNORE).sum().clamp_min(1)
    if isinstance(count, torch.Tensor):
        count = count.to(total.device)
    return total / count


def _visible_counts(until: torch.Tensor) -> torch.Tensor:
    """Keys visible to each query when key k is visible to queries k .. until[k]-1."""
    batch, size = until.shape
    held = torch.zeros(batch, size + 1, dtype=torch.long, device=until.device)
    held[:, :size] = 1
    held.scatter_add_(1, until.long(), -torch.ones_like(until, dtype=torch.long))
    return held.cumsum(1)[:, :size]


def restricted_positions(
    expiry_values: torch.Tensor, document_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """[B, S] bool: queries that see fewer keys under the memento mask than under causal attention."""
    memento = _visible_counts(visible_until(expiry_values, document_ids))
    causal = _visible_counts(
        visible_until(torch.full_like(expiry_values, torch.iinfo(torch.long).max), document_ids)
    )
    return memento < causal


def retention_kl(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor,
    restricted: torch.Tensor,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean KL(p_teacher ‖ p_student) over positions that predict a completion token and whose
    visible set is restricted (scaled by T², as in distillation). Returns (kl, position count)."""
    positions = restricted[:, :-1] & (labels[:, 1:] != IGNORE)
    count = positions.sum()
    if count == 0:
        return student_logits.sum() * 0.0, count
    student = F.log_softmax(student_logits[:, :-1][positions].float() / temperature, dim=-1)
    teacher = F.log_softmax(teacher_logits[:, :-1][positions].float() / temperature, dim=-1)
    kl = F.kl_div(student, teacher, log_target=True, reduction="sum") / count
    return kl * temperature**2, count

"""Head slots, in one place: which (layer, head) slots a model has, their labels, the widest layer, and the top k
heads by a score. Layers may have different head counts (a pruned model); an (L, H) tensor is as wide as the widest
layer, and the slots past a layer's own heads exist in no computation."""

import torch
from torch import Tensor

from headcount.labels import Head, head_label

head_name = head_label  # a head's label everywhere (masks, tables, figures, findings): L1H3 (headcount/labels.py)


def all_heads(heads_per_layer: list[int]) -> list[Head]:
    """Every head, in (layer, head) order."""
    return [(layer, head) for layer, n in enumerate(heads_per_layer) for head in range(n)]


def max_heads(heads_per_layer: list[int]) -> int:
    """The width of an (L, H) tensor: the widest layer's head count, at least 1 (a layer pruned to no heads keeps
    gate tensors well-formed)."""
    return max(max(heads_per_layer), 1)


def existing_heads(heads_per_layer: list[int], width: int | None = None, device=None) -> Tensor:
    """(L, H) bool: which head slots exist; `width`: H (default: max_heads)."""
    width = max_heads(heads_per_layer) if width is None else width
    return torch.arange(width, device=device) < torch.tensor(heads_per_layer, device=device)[:, None]


def top_heads(score_LH: Tensor, heads_per_layer: list[int], k: int) -> list[Head]:
    """The k existing heads of highest score, highest first; ties go to the lower (layer, head)."""
    heads = all_heads(heads_per_layer)
    scores = torch.tensor([float(score_LH[h]) for h in heads], dtype=torch.float64)
    order = torch.sort(-scores, stable=True).indices[:k]
    return [heads[i] for i in order.tolist()]

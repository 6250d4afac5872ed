"""The metric circuit analysis reads: a callable on the logits at the score points, (B, V) -> (B,) per point, such as
headcount's metric objects or `lambda logits: logits[:, a] - logits[:, w]` with the caller's answers, summed over the
points in float64. Score positions (B,) name each prompt's scored position, so right-padded prompts of different
lengths score where they end."""

from collections.abc import Callable

import torch
from torch import Tensor

Metric = Callable[[Tensor], Tensor]


def last_positions(ids_BT: Tensor) -> Tensor:
    """Every prompt scored at the last position (unpadded prompts)."""
    return torch.full((ids_BT.shape[0],), ids_BT.shape[1] - 1, dtype=torch.long, device=ids_BT.device)


def metric_sums(logits_RTV: Tensor, score_positions_B: Tensor, metric: Metric) -> Tensor:
    """(N,) float64: the metric summed over the B points of each of the N = R / B runs stacked along the batch
    (run n holds rows n*B .. (n+1)*B - 1), differentiable."""
    B = score_positions_B.shape[0]
    N = logits_RTV.shape[0] // B
    if score_positions_B.dtype == torch.bool:  # a (B, T) mask of score points
        points_NPV = logits_RTV.view(N, B, *logits_RTV.shape[1:])[:, score_positions_B]
        return torch.stack([metric(points_NPV[n]).double().sum() for n in range(N)])
    points_NBV = logits_RTV.view(N, B, *logits_RTV.shape[1:])[:, torch.arange(B), score_positions_B]
    return torch.stack([metric(points_NBV[n]).double().sum() for n in range(N)])

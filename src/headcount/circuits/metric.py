"""The metric circuit analysis reads: a callable on the logits at the score points, (P, V) -> (P,) per point, such as
`lambda logits: logits[:, a] - logits[:, w]` with fixed tokens a and w, summed over the points in float64. Score
positions name each prompt's scored position ((B,): one per prompt, so right-padded prompts of different lengths score
where they end) or mark score points ((B, T) bool, several per prompt; points in row-major order).

Passes evaluate a share of the examples at a time (passes.py), so the metric sees the points of those examples only.
A metric that reads data of its own per point (each prompt's answer) is a `PointMetric`, which hands it the rows of
that data for the points it is called on; a plain callable must not read per-point data (a callable that does fails
on a wrong length when the examples are split).

Every result is the sum over all points of the per-point values, in float64 and in point order: the same additions
in the same order whatever the passes, so a split gives the same bits every time, and another split changes a sum
only as far as a pass's size changes the rounding of the per-point values (matrix kernels block by size).
"""

from collections.abc import Callable

import torch
from torch import Tensor

Metric = Callable[[Tensor], Tensor]


class PointMetric:
    """fn(logits_PV, *data_P) -> (P,), with per-point data (answers, wrong answers: (P, ...) tensors or None) that
    `at` restricts to the points a pass evaluates."""

    def __init__(self, fn: Callable[..., Tensor], *data: Tensor | None):
        self.fn, self.data = fn, data

    def __call__(self, logits_PV: Tensor) -> Tensor:
        return self.fn(logits_PV, *self.data)

    def at(self, points: slice) -> "PointMetric":
        return PointMetric(self.fn, *(None if d is None else d[points] for d in self.data))


def metric_at(metric: Metric, points: slice) -> Metric:
    """The metric for the points `points` (a slice of the point order) alone."""
    return metric.at(points) if isinstance(metric, PointMetric) else metric


def last_positions(ids_BT: Tensor) -> Tensor:
    """Every prompt scored at the last position (unpadded prompts)."""
    return torch.full((ids_BT.shape[0],), ids_BT.shape[1] - 1, dtype=torch.long, device=ids_BT.device)


def points_mask(ids_BT: Tensor, score_positions_B: Tensor | None) -> Tensor:
    """(B, T) bool: the score points, from positions (B,) (default: the last) or a mask as given."""
    if score_positions_B is not None and score_positions_B.dtype == torch.bool:
        return score_positions_B
    positions = last_positions(ids_BT) if score_positions_B is None else score_positions_B
    mask = torch.zeros(ids_BT.shape, dtype=torch.bool, device=ids_BT.device)
    mask[torch.arange(ids_BT.shape[0], device=ids_BT.device), positions] = True
    return mask


def point_values(logits_NPV: Tensor, metric: Metric) -> Tensor:
    """(N, P) float64: the metric at each of the P points of each of N runs, differentiable."""
    values = []
    for logits_PV in logits_NPV:
        value_P = metric(logits_PV)
        if value_P.shape != logits_PV.shape[:1]:
            raise ValueError(
                f"the metric gave shape {tuple(value_P.shape)} for {len(logits_PV)} points: it must give one value "
                "per point; a metric that reads per-point data (answers) is a headcount.circuits.PointMetric"
            )
        values.append(value_P.double())
    return torch.stack(values)

"""A share of the examples: what one process of a scan over several computes (ablation/records/distributed.py).

Every edge evaluation of the core (exact scores, EAP, EAP-IG, path patching, circuits' metrics) can return one value
per example (`per_example=True`), each example's points summed apart: an example's value depends only on that
example's clean and corrupted runs and its points. So the examples can be split into contiguous shares, each share
evaluated alone, and the per-example tables stacked back: the table of all examples, from which the scores are the
sums over examples (in float64, in example order, whoever computed a row) and the bootstrap's resamples are drawn
(bootstrap.py). A share holds the same T (the joined batch's right padding) and its points' slice of the metric's
per-point data.
"""

from dataclasses import dataclass

from torch import Tensor

from headcount.circuits.forward import NodeOutputs
from headcount.circuits.metric import Metric, metric_at


def example_share(n_examples: int, size: int, rank: int) -> slice:
    """The contiguous examples process `rank` of `size` evaluates: n // size each, the first n % size one more."""
    if not 0 <= rank < size:
        raise ValueError(f"process {rank} of {size}")
    base, extra = divmod(n_examples, size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


@dataclass
class ExampleShare:
    """The core's inputs for some examples: their clean ids, their corrupted run, their score points and the
    metric restricted to those points."""

    clean_ids_BT: Tensor
    corrupted: Tensor | NodeOutputs
    points_BT: Tensor
    metric: Metric

    @classmethod
    def of(
        cls, clean_ids_BT: Tensor, corrupted: Tensor | NodeOutputs, points_BT: Tensor, metric: Metric, examples: slice
    ) -> "ExampleShare":
        ends = [0, *points_BT.sum(1).cumsum(0).tolist()]
        columns = slice(ends[examples.start], ends[examples.stop])
        corrupted_share = run_share(corrupted, examples)
        return cls(clean_ids_BT[examples], corrupted_share, points_BT[examples], metric_at(metric, columns))


def run_share(run: Tensor | NodeOutputs, examples: slice) -> Tensor | NodeOutputs:
    """A run's ids, or its given outputs, for these examples (nothing computed)."""
    if isinstance(run, NodeOutputs):
        return NodeOutputs(run.emb[examples], [z[examples] for z in run.z], [m[examples] for m in run.mlp])
    return run[examples]

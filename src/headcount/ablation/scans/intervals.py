"""Uncertainty of a mask scan's deltas over its examples (a task's prompts, or the sequences of the run's data): the
bootstrap (circuits/bootstrap.py) from each example's sums, which the evaluator keeps at no extra pass
(ablation/engine/evaluator.py `MaskTotals.examples`), and how stable the scan's top heads are across resamples.

Mask m's delta is D_m = sum_p (c_mp - c0_p) / sum_p n_p: c_mp example p's primary metric column summed over its
score points with mask m, c0_p the same with no head off, n_p its points. c0 comes from a mask with no head off that
the scan evaluates beside its own (its first touched layer is past the last, so the evaluator hands it the clean
pass's sums: no forward). A resample draws the examples with replacement (seeded by `ablation.seed`) and recomputes
every D_m; the table's `delta_<metric>_ci_low` and `_ci_high` are the 2.5% and 97.5% quantiles over 1000 resamples.
The scan's "few heads", its top n by damage (n: 5% of its masks, at least 1, as ioi_heads' "top 5%"), are the full
data's; `mean_overlap` and `min_overlap` say how much of them each resample's top n holds (summary.json's
`intervals` entry, with `top_share` per mask in the table: the share of resamples with the mask in the top n).
"""

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from headcount.ablation.engine.evaluation import CounterpartSums
from headcount.ablation.engine.evaluator import MaskEvaluator, MaskTotals
from headcount.ablation.engine.metrics import Metric, Targets
from headcount.circuits.bootstrap import (
    LEVEL,
    RESAMPLES,
    percentile_interval,
    resample_counts,
    resampled_score,
    top_n_stability,
)
from headcount.io import atomic_savefig
from headcount.plotting import new_figure, set_title

TOP_SHARE = 0.05  # the top heads whose stability is reported: 5% of the masks, at least one
BOOTSTRAP_RULE = f"bootstrap: {RESAMPLES} resamples of examples, {LEVEL} percentile intervals, top {TOP_SHARE:.0%}"
BOOTSTRAP_RULE += ", ratios (gap_fraction, faithfulness) resampled whole"  # tables before them lack their columns
NOT_KEPT = "not computed: the scan resumed from partial files written without each example's sums; rerun it"


def example_points(evaluator: MaskEvaluator) -> Tensor:
    """(E,) float64: each example's score points, in the evaluator's example order."""
    return torch.cat([Targets.of(batch).where_BT.sum(1).cpu() for batch in evaluator.batches]).double()


def top_n(n_masks: int) -> int:
    return max(1, math.ceil(TOP_SHARE * n_masks))


@dataclass
class ExampleSums:
    """What a mask scan's bootstrap resamples: each mask's examples' sums (M, E), the unmasked model's (E,), their
    score points (E,), and the resamples' counts (R, E), drawn once per scan so that every column's interval (the
    delta's, gap_fraction's, faithfulness') comes from the same resamples."""

    masks_ME: Tensor
    baseline_E: Tensor
    points_E: Tensor
    counts_RE: Tensor

    def delta_interval(self) -> tuple[Tensor, Tensor]:
        return percentile_interval((self.masks_ME - self.baseline_E[None]).T, self.points_E, self.counts_RE, LEVEL)

    def share_interval(self, numerator_ME: Tensor, denominator_E: Tensor, denominator_points_E: Tensor):
        """The interval of sum(numerator)/sum(points) divided by sum(denominator)/sum(denominator's points), both
        over the same resample: a ratio of two means, such as a share of a gap."""
        divisor_R = resampled_score(denominator_E, denominator_points_E, self.counts_RE)
        return percentile_interval(numerator_ME.T, self.points_E, self.counts_RE, LEVEL, divisor_R)


def example_sums(totals: MaskTotals, baseline_E: Tensor | None, points_E: Tensor, seed: int) -> ExampleSums | None:
    """The scan's bootstrap units, None where they were not kept (a scan resumed from an old partial file)."""
    if totals.examples is None or baseline_E is None or not len(totals.examples):
        return None
    return ExampleSums(totals.examples, baseline_E, points_E, resample_counts(len(points_E), RESAMPLES, seed))


def with_intervals(
    table: pd.DataFrame,
    totals: MaskTotals,
    baseline_E: Tensor | None,
    points_E: Tensor,
    metric: Metric,
    seed: int,
    counterpart: CounterpartSums | None = None,
) -> tuple[pd.DataFrame, dict]:
    """The table with its primary delta's interval columns (and gap_fraction's, where the table has it and the
    counterparts' sums are given) and top_share, and the summary entry (the resamples, the level, the top n's
    stability); NaN columns and the reason where examples' sums were not kept."""
    low_col, high_col = f"delta_{metric.primary}_ci_low", f"delta_{metric.primary}_ci_high"
    gap = ["gap_fraction_ci_low", "gap_fraction_ci_high"] if "gap_fraction" in table else []
    sums = example_sums(totals, baseline_E, points_E, seed)
    if sums is None or not len(table):  # an empty table: Scan.run refuses it
        nan = dict.fromkeys([low_col, high_col, *gap, "top_share"], float("nan"))
        return table.assign(**nan), {"intervals": NOT_KEPT}
    low, high = sums.delta_interval()
    table = table.assign(**{low_col: low.numpy(), high_col: high.numpy()})
    if gap:
        table = table.assign(**dict(zip(gap, gap_fraction_interval(sums, counterpart))))
    n = top_n(len(sums.masks_ME))
    delta_EM = (sums.masks_ME - baseline_E[None]).T
    stability = top_n_stability(metric.damage(delta_EM, 0.0), points_E, sums.counts_RE, n, magnitude=False)
    table = table.assign(top_share=stability["inclusion"].numpy())
    entry = {"resamples": RESAMPLES, "level": LEVEL, "by": "damage", "top_n": n}
    entry |= {k: stability[k] for k in ("mean_overlap", "min_overlap")}
    return table, entry


def gap_fraction_interval(sums: ExampleSums, counterpart: CounterpartSums | None) -> tuple:
    """gap_fraction = (M(mask) - M(clean)) / (M(counterpart) - M(clean)): the mask's delta over the gap, both
    resampled with the same prompts (a prompt's counterpart is drawn with it); NaN without the counterparts' sums."""
    M = len(sums.masks_ME)
    if counterpart is None or len(counterpart.examples_E) != len(sums.points_E):
        return np.full(M, np.nan), np.full(M, np.nan)
    gap_R = resampled_score(counterpart.examples_E, counterpart.points_E, sums.counts_RE) - resampled_score(
        sums.baseline_E, sums.points_E, sums.counts_RE
    )
    numerator_EM = (sums.masks_ME - sums.baseline_E[None]).T
    low, high = percentile_interval(numerator_EM, sums.points_E, sums.counts_RE, LEVEL, gap_R)
    return low.numpy(), high.numpy()


def score_intervals(
    contributions_EK: Tensor, points_E: Tensor, column: str, seed: int, magnitude: bool = True
) -> tuple[dict, dict]:
    """A per-head score that is a sum over examples divided by their points (a direct effect, an attribution
    estimate, an attention-pattern score): its <column>_ci_low, _ci_high and top_share columns, and the summary entry
    of the stability of its top heads by |score| (magnitude=False: by score, largest first; 5% of them, at least one)
    over the same resamples."""
    counts = resample_counts(len(points_E), RESAMPLES, seed)
    low, high = percentile_interval(contributions_EK, points_E, counts, LEVEL)
    n = top_n(contributions_EK.shape[1])
    stability = top_n_stability(contributions_EK, points_E, counts, n, magnitude=magnitude)
    columns = {f"{column}_ci_low": low.numpy(), f"{column}_ci_high": high.numpy()}
    entry = {"resamples": RESAMPLES, "level": LEVEL, "by": f"|{column}|" if magnitude else column, "top_n": n}
    entry |= {k: stability[k] for k in ("mean_overlap", "min_overlap")}
    return columns | {"top_share": stability["inclusion"].numpy()}, entry


def interval_figure(
    table: pd.DataFrame,
    path: Path,
    title: str,
    label: str,
    value: str,
    shown: int = 20,
    beside: tuple[str, str] | None = None,
) -> Path:
    """The `shown` masks of largest |value| with their intervals as error bars, largest at the top; beside: (column,
    label) of a second value with intervals (gap_fraction), drawn for the same masks in a panel to the right."""
    rows = table.loc[table[value].abs().sort_values(ascending=False).index[:shown]][::-1]
    panels = [(value, label)] + ([beside] if beside is not None else [])
    fig = new_figure(6 * len(panels), 1.5 + 0.25 * len(rows))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (column, what) in zip(axes, panels):
        centre = rows[column].to_numpy(float)
        low, high = rows[f"{column}_ci_low"].to_numpy(float), rows[f"{column}_ci_high"].to_numpy(float)
        # the interval as a line, not as errors around the value: a percentile interval need not hold the value
        ax.hlines(range(len(rows)), low, high, linewidth=0.8)
        ax.plot(centre, range(len(rows)), "o", markersize=3)
        ax.set_yticks(range(len(rows)), rows["mask"].astype(str), fontsize=7)
        ax.axvline(0.0, color="black", linewidth=0.6)
        ax.set(xlabel=f"{what}, {LEVEL:.0%} bootstrap interval over examples")
    set_title(axes[0], title)
    atomic_savefig(fig, path, dpi=120)
    return Path(path)

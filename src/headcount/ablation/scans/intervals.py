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
from pathlib import Path

import pandas as pd
import torch
from torch import Tensor

from headcount.ablation.engine.evaluator import MaskEvaluator, MaskTotals
from headcount.ablation.engine.metrics import Metric, Targets
from headcount.circuits.bootstrap import LEVEL, RESAMPLES, percentile_interval, resample_counts, top_n_stability
from headcount.io import atomic_savefig
from headcount.plotting import new_figure, set_title

TOP_SHARE = 0.05  # the top heads whose stability is reported: 5% of the masks, at least one
BOOTSTRAP_RULE = f"bootstrap: {RESAMPLES} resamples of examples, {LEVEL} percentile intervals, top {TOP_SHARE:.0%}"
NOT_KEPT = "not computed: the scan resumed from partial files written without each example's sums; rerun it"


def example_points(evaluator: MaskEvaluator) -> Tensor:
    """(E,) float64: each example's score points, in the evaluator's example order."""
    return torch.cat([Targets.of(batch).where_BT.sum(1).cpu() for batch in evaluator.batches]).double()


def top_n(n_masks: int) -> int:
    return max(1, math.ceil(TOP_SHARE * n_masks))


def with_intervals(
    table: pd.DataFrame, totals: MaskTotals, baseline_E: Tensor | None, points_E: Tensor, metric: Metric, seed: int
) -> tuple[pd.DataFrame, dict]:
    """The table with its primary delta's interval columns and top_share, and the summary entry (the resamples, the
    level, the top n's stability); NaN columns and the reason where examples' sums were not kept."""
    low_col, high_col = f"delta_{metric.primary}_ci_low", f"delta_{metric.primary}_ci_high"
    if totals.examples is None or baseline_E is None or not len(table):  # an empty table: Scan.run refuses it
        return table.assign(**{low_col: float("nan"), high_col: float("nan"), "top_share": float("nan")}), {
            "intervals": NOT_KEPT
        }
    delta_EM = (totals.examples - baseline_E[None]).T  # each example's contribution to each mask's delta
    counts = resample_counts(len(points_E), RESAMPLES, seed)
    low, high = percentile_interval(delta_EM, points_E, counts, LEVEL)
    n = top_n(delta_EM.shape[1])
    stability = top_n_stability(metric.damage(delta_EM, 0.0), points_E, counts, n, magnitude=False)
    table = table.assign(**{low_col: low.numpy(), high_col: high.numpy(), "top_share": stability["inclusion"].numpy()})
    entry = {"resamples": RESAMPLES, "level": LEVEL, "by": "damage", "top_n": n}
    entry |= {k: stability[k] for k in ("mean_overlap", "min_overlap")}
    return table, entry


def interval_figure(table: pd.DataFrame, path: Path, title: str, label: str, value: str, shown: int = 20) -> Path:
    """The `shown` masks of largest |delta| with their intervals as error bars, largest at the top."""
    rows = table.loc[table[value].abs().sort_values(ascending=False).index[:shown]][::-1]
    fig = new_figure(6, 1.5 + 0.25 * len(rows))
    ax = fig.add_subplot()
    centre = rows[value].to_numpy(float)
    errors = [centre - rows[f"{value}_ci_low"].to_numpy(float), rows[f"{value}_ci_high"].to_numpy(float) - centre]
    ax.errorbar(centre, range(len(rows)), xerr=errors, fmt="o", markersize=3, capsize=2, linewidth=0.8)
    ax.set_yticks(range(len(rows)), rows["mask"].astype(str), fontsize=7)
    ax.axvline(0.0, color="black", linewidth=0.6)
    ax.set(xlabel=f"{label}, {LEVEL:.0%} bootstrap interval over examples")
    set_title(ax, title)
    atomic_savefig(fig, path, dpi=120)
    return Path(path)

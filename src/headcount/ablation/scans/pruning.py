"""`pruning`: masked pruning curves for every order in ablation.pruning.orders (ablation/methods/pruning.py), resumable
like a mask scan, and each order's prunable fraction in summary.json (with the orders that came out arbitrary), which
the structural export can use. Its figure shows the loss relative to the baseline, in %, on an axis linear within
the tolerance and logarithmic beyond, so that the tolerance line stays visible next to losses many times larger.

On an encoder-decoder (its heads one grid of three kinds, labels.KindRows) the table has a `kind` column: `all`, the
curves over every head, then each kind's curves, pruning that kind's heads alone (the fraction a share of that kind's
heads, the other kinds' heads all on); summary.json's prunable_fraction is the all-kinds curves', and
prunable_fraction_by_kind each kind's. One figure per kind: pruning.png over every head, pruning_<kind>.png."""

from dataclasses import asdict
from pathlib import Path

import pandas as pd
import torch
from matplotlib.ticker import FuncFormatter
from torch import Tensor

from headcount.ablation.engine.masks import gates_to_masks
from headcount.ablation.engine.metrics import Loss, Metric, require_differentiable
from headcount.ablation.methods.importance import Importance
from headcount.ablation.methods.pruning import PRUNING_ORDERS, prunable_fractions, pruning_curves
from headcount.ablation.scans.base import KINDS, Scan, ScanSettings
from headcount.ablation.scans.single_head import SingleHeadScan, single_head_delta
from headcount.config.ablation import AblationConfig, validate_pruning_config
from headcount.errors import ConfigError
from headcount.io import atomic_savefig
from headcount.labels import HEAD_KINDS, KIND_NAMES, KindRows
from headcount.plotting import new_figure, set_title


@KINDS.register
class PruningScan(Scan):
    kind = "pruning"
    doc = "heads removed step by step in gradient, single-head and random orders"
    reads = Scan.reads | {"model", "baseline", "importance", "evaluator", "positions"}

    @classmethod
    def check(cls, name: str, cfg: ScanSettings, settings: AblationConfig) -> None:
        validate_pruning_config(settings.pruning)
        if any(PRUNING_ORDERS.get(str(order)).follows_gradient for order in settings.pruning.orders):
            require_differentiable(settings.metric, "the gradient pruning orders (ablation.pruning.orders)")

    def needs(self) -> list[str]:
        return [SingleHeadScan.kind] if "single_head" in self.session.settings.pruning.orders else []

    def fingerprint_parts(self) -> tuple:
        s = self.session.settings
        return (self.kind, asdict(s.pruning), s.normalize_importance, s.seed)

    def compute(self, key: str) -> pd.DataFrame:
        session, s = self.session, self.session.settings

        def evaluate(gates_MLH: Tensor) -> dict[str, Tensor]:
            return self.evaluate(gates_to_masks(gates_MLH, session.model.heads_per_layer), key).values()

        delta_LH = single_head_delta(session) if "single_head" in s.pruning.orders else None
        hpl, baseline = session.model.heads_per_layer, session.baseline
        curves = pruning_curves(
            evaluate, session.importance, delta_LH, hpl, s.pruning, s.seed, baseline, session.metric
        )
        if not isinstance(hpl, KindRows):
            return curves
        tables = [curves.assign(kind=ALL_KINDS)]
        for kind in hpl.kinds():  # each kind's heads pruned alone, every other head on
            within = KindScope(hpl, kind)
            delta = None if delta_LH is None else within.part(delta_LH)
            kind_curves = pruning_curves(
                lambda gates, scope=within: evaluate(scope.whole(gates)),
                lambda mask, scope=within: scope.importance(session.importance(scope.whole(mask))),
                delta,
                within.grid,
                s.pruning,
                s.seed,
                baseline,
                session.metric,
            )
            tables.append(kind_curves.assign(kind=kind))
        table = pd.concat(tables, ignore_index=True)
        return table[["kind", *curves.columns]]

    def figures(self, table: pd.DataFrame) -> list[Path | None]:
        metric = self.session.metric
        worse = f"{metric.name} increase over" if not metric.named_in_results else f"{metric.name} worse than"
        tolerance = self.session.settings.pruning.tolerance
        baseline = self.session.baseline[metric.primary]
        if "kind" not in table:
            title = self.title(f"{worse} the baseline (%) against heads pruned")
            return [pruning_figure(table, self.path(".png"), baseline, tolerance, title, metric)]
        figures = []
        for kind, curves in table.groupby("kind", sort=False):  # the kinds apart: a figure each
            heads = "every kind's heads" if kind == ALL_KINDS else f"{KIND_NAMES[kind]} heads alone"
            title = self.title(f"{worse} the baseline (%) against {heads} pruned")
            path = self.path(".png", "" if kind == ALL_KINDS else f"_{kind}")
            figures.append(pruning_figure(curves, path, baseline, tolerance, title, metric))
        return figures

    def file_names(self) -> list[tuple[str, str]]:
        return [*super().file_names(), *((f"_{kind}", ".png") for kind in HEAD_KINDS)]

    def use(self, table: pd.DataFrame) -> None:
        metric = self.session.metric
        baseline, tolerance = self.session.baseline[metric.primary], self.session.settings.pruning.tolerance
        by_kind = prunable_by_kind(table, baseline, tolerance, metric)
        if "kind" in table:  # an encoder-decoder's: the export and the summary read the curves over every head
            table = table[table["kind"].astype(str) == ALL_KINDS]
        prunable = prunable_fractions(table, baseline, tolerance, metric)
        arbitrary = arbitrary_orders(table)
        self.session.hand(self.kind, prunable)
        entries = {"prunable_fraction": prunable, "arbitrary_orders": arbitrary}
        self.session.files.update_summary({**entries, **({"prunable_fraction_by_kind": by_kind} if by_kind else {})})


ALL_KINDS = "all"  # the kind column's value for the curves over every head of an encoder-decoder


def prunable_by_kind(curves: pd.DataFrame, baseline: float, tolerance: float, metric: Metric) -> dict:
    """Each kind's prunable fractions from its own curves (an encoder-decoder's table); {} for a table without kinds."""
    if "kind" not in curves:
        return {}
    kinds = curves["kind"].astype(str)
    return {
        kind: prunable_fractions(curves[kinds == kind], baseline, tolerance, metric)
        for kind in dict.fromkeys(kinds)
        if kind != ALL_KINDS
    }


class KindScope:
    """One kind's heads of an encoder-decoder's grid as a grid of their own: its gates and scores cut out of the
    whole grid's (`part`), and put back with every other head on (`whole`)."""

    def __init__(self, grid: KindRows, kind: str):
        self.rows = grid.kind_rows(kind)
        self.heads = grid[self.rows[0]]
        self.shape = (len(grid), max(grid))
        self.grid = KindRows({kind: (len(self.rows), self.heads)})

    def part(self, values_XLH: Tensor) -> Tensor:
        return values_XLH[..., self.rows, : self.heads]

    def whole(self, gates_XLH: Tensor) -> Tensor:
        full = torch.ones(*gates_XLH.shape[:-2], *self.shape, dtype=gates_XLH.dtype, device=gates_XLH.device)
        full[..., self.rows, : self.heads] = gates_XLH
        return full

    def importance(self, scores: Importance) -> Importance:
        return Importance(self.part(scores.score_LH), self.part(scores.raw_LH))


def prunable_fraction(session, order: str) -> float:
    """The largest fraction of heads that pruning order removes within tolerance, from this session's pruning scan,
    else from the scan run (or read back) under the name `pruning`."""
    prunable = session.provided(PruningScan.kind)
    if order not in prunable:
        raise ConfigError(
            "ablation.prune.order",
            order,
            f"has no pruning curve: add it to ablation.pruning.orders ({', '.join(prunable)}) "
            "or set ablation.prune.fraction",
        )
    return prunable[order]


def arbitrary_orders(curves: pd.DataFrame) -> list[str]:
    """The orders whose ranking was arbitrary (every head scored the same); none in tables that predate the column."""
    if "arbitrary_order" not in curves:
        return []
    flagged = curves.loc[curves["arbitrary_order"].astype(str) == "True", "order"]
    return list(dict.fromkeys(flagged))


def pruning_figure(
    curves: pd.DataFrame,
    path: str | Path,
    baseline_loss: float,
    tolerance: float,
    title: str,
    metric: Metric | None = None,
) -> Path:
    """How much worse than the baseline the metric is, relative to it (for loss, loss / baseline - 1; in %), against
    the fraction of heads pruned, a line per order; random as the mean over seeds with a min-max band; the baseline
    (0%) and the tolerance as horizontal lines. The axis is symmetric-log, linear up to the tolerance, so the
    tolerance band is as tall as a decade of loss."""
    metric = metric or Loss()
    fig = new_figure(7, 4.5)
    ax = fig.add_subplot()
    arbitrary = set(arbitrary_orders(curves))
    worse = lambda values: 100 * metric.damage(values, baseline_loss) / abs(baseline_loss)  # noqa: E731
    relative = worse(curves[metric.primary])
    linthresh = max(100 * tolerance, 0.1)
    for order, curve in curves.groupby("order", sort=False):
        by_fraction = worse(curve[metric.primary]).groupby(curve["fraction"])
        mean = by_fraction.mean()
        label = f"{order} (arbitrary: every head scored the same)" if order in arbitrary else order
        (line,) = ax.plot(mean.index, mean.to_numpy(), marker="o", markersize=3, label=label)
        if curve["seed"].nunique() > 1:
            ax.fill_between(mean.index, by_fraction.min(), by_fraction.max(), color=line.get_color(), alpha=0.2)
    ax.axhline(0, color="black", linestyle="--", linewidth=1, label=f"baseline ({baseline_loss:.4g} {metric.unit})")
    ax.axhline(100 * tolerance, color="tab:red", linestyle=":", linewidth=1.2, label=f"tolerance {100 * tolerance:g}%")
    ax.set_yscale("symlog", linthresh=linthresh)
    # Below the baseline only as far as a curve goes: no empty decades of "better than the full model".
    ax.set_ylim(bottom=min(1.2 * float(relative.min()), -0.5 * linthresh))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}%"))
    named = metric.named_in_results
    ylabel = f"{metric.name}: worse than baseline (% of it)" if named else f"{metric.name} / baseline - 1 (%)"
    ax.set(xlabel="fraction of heads pruned", ylabel=ylabel)
    ax.set_xlim(-0.02, 1.02)
    set_title(ax, title)
    ax.legend(fontsize=8)
    atomic_savefig(fig, path, dpi=120)
    return Path(path)

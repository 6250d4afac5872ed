"""`pruning`: masked pruning curves for every order in ablation.pruning.orders (ablation/pruning.py), resumable
like a mask scan, and each order's prunable fraction in summary.json, which the structural export can use."""

from dataclasses import asdict
from pathlib import Path

import pandas as pd
from torch import Tensor

from headcount.ablation.masks import gates_to_masks
from headcount.ablation.pruning import prunable_fractions, pruning_curves
from headcount.ablation.scans.base import Scan, register
from headcount.ablation.scans.single_head import single_head_delta
from headcount.config.ablation import AblationConfig, ScanConfig, validate_pruning_config
from headcount.errors import ConfigError
from headcount.io import atomic_savefig
from headcount.plotting import new_figure


@register
class PruningScan(Scan):
    kind = "pruning"

    @classmethod
    def check(cls, name: str, cfg: ScanConfig, settings: AblationConfig) -> None:
        validate_pruning_config(settings.pruning)

    def fingerprint_parts(self) -> tuple:
        s = self.session.settings
        return (self.kind, asdict(s.pruning), s.normalize_importance, s.seed)

    def compute(self, key: str) -> pd.DataFrame:
        session, s = self.session, self.session.settings

        def evaluate(gates_MLH: Tensor) -> dict[str, Tensor]:
            totals = self.evaluate(gates_to_masks(gates_MLH, session.heads_per_layer), key)
            return {"loss": totals.loss(), "acc": totals.acc()}

        delta_LH = single_head_delta(session) if "single_head" in s.pruning.orders else None
        hpl, baseline = session.heads_per_layer, session.baseline
        return pruning_curves(evaluate, session.importance, delta_LH, hpl, s.pruning, s.seed, baseline)

    def figures(self, table: pd.DataFrame) -> list[Path | None]:
        s = self.session.settings
        title = f"{self.name}: {s.mode} ablation, loss vs heads pruned"
        path = self.session.out / f"{self.name}.png"
        return [pruning_figure(table, path, self.session.baseline["loss"], s.pruning.tolerance, title)]

    def use(self, table: pd.DataFrame) -> None:
        prunable = prunable_fractions(table, self.session.baseline["loss"], self.session.settings.pruning.tolerance)
        self.session.shared[self.kind] = prunable
        self.session.files.update_summary({"prunable_fraction": prunable})


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


def pruning_figure(curves: pd.DataFrame, path: str | Path, baseline_loss: float, tolerance: float, title: str) -> Path:
    """Loss against the fraction of heads pruned, a line per order; random as the mean over seeds with a min-max
    band; the baseline and the tolerance threshold as horizontal lines."""
    fig = new_figure(7, 4.5)
    ax = fig.add_subplot()
    for order, curve in curves.groupby("order", sort=False):
        by_fraction = curve.groupby("fraction")["loss"]
        mean = by_fraction.mean()
        (line,) = ax.plot(mean.index, mean.to_numpy(), marker="o", markersize=3, label=order)
        if curve["seed"].nunique() > 1:
            ax.fill_between(mean.index, by_fraction.min(), by_fraction.max(), color=line.get_color(), alpha=0.2)
    ax.axhline(baseline_loss, color="black", linestyle="--", linewidth=1, label="baseline")
    ax.axhline(
        baseline_loss * (1 + tolerance), color="grey", linestyle=":", linewidth=1, label=f"tolerance {tolerance:g}"
    )
    ax.set(xlabel="fraction of heads pruned", ylabel="loss", title=title)
    ax.legend()
    atomic_savefig(fig, path, dpi=120)
    return Path(path)

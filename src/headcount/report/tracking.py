"""What a run's results send to W&B: the ablation tables, figures and pruning curves, and the headline numbers that
compare runs in W&B's run table."""

import json
from pathlib import Path
from typing import Any

import pandas as pd

from headcount.run_dir import RunPaths


def summary_headline(summary: dict) -> dict[str, Any]:
    """The numbers from ablation/summary.json that compare runs: baseline loss and accuracy, the prunable fraction per
    pruning order, the most important head (the one whose removal alone raised the loss most)."""
    headline = {key: summary[key] for key in ("baseline_loss", "baseline_acc") if key in summary}
    for order, fraction in summary.get("prunable_fraction", {}).items():
        headline[f"prunable_fraction/{order}"] = fraction
    if top := summary.get("most_important_head"):
        headline["most_important_head"] = top["mask"]
        headline["most_important_head_delta_loss"] = top["delta_loss"]
    return headline


def log_ablation_results(run_dir: str | Path, wandb_run: Any) -> None:
    """Send <run>/ablation/ to a W&B run: each CSV as a table, each figure as an image, the pruning curves as a line
    plot with one series per order (mean over seeds), and summary.json's headline numbers into the run summary."""
    import wandb

    ablation = RunPaths(Path(run_dir)).ablation
    if not ablation.is_dir():
        return
    logged: dict[str, Any] = {}
    for csv in sorted(ablation.glob("*.csv")):
        if not csv.name.endswith(".partial.csv"):
            logged[f"ablation/table/{csv.stem}"] = wandb.Table(dataframe=pd.read_csv(csv))
    for png in sorted(ablation.glob("*.png")):
        logged[f"ablation/figure/{png.stem}"] = wandb.Image(str(png))
    if (pruning := ablation / "pruning.csv").exists():
        mean_loss = pd.read_csv(pruning).groupby(["order", "fraction"], sort=False)["loss"].mean()
        orders = list(mean_loss.index.unique("order"))
        logged["ablation/pruning_curves"] = wandb.plot.line_series(
            xs=[mean_loss[order].index.tolist() for order in orders],
            ys=[mean_loss[order].tolist() for order in orders],
            keys=orders,
            title="loss against the fraction of heads pruned (mean over seeds)",
            xname="fraction of heads pruned",
        )
    if logged:
        wandb_run.log(logged)
    if (summary := ablation / "summary.json").exists():
        headline = summary_headline(json.loads(summary.read_text()))
        wandb_run.summary.update({f"ablation/{key}": value for key, value in headline.items()})


def log_run_results(run_dir: Path, metrics: dict) -> None:
    """Into this job's W&B run: the final metrics (with the parameter count) and the ablation results."""
    import wandb

    wandb.run.summary.update({key: value for key, value in metrics.items() if value is not None})
    log_ablation_results(run_dir, wandb.run)

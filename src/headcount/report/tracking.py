"""What a run's results send to W&B: the ablation tables, figures and pruning curves, and the headline numbers that
compare runs in W&B's run table and in sweep reports.

A run's headline comes from the ablation mode its own config asks for (zero unless the experiment says otherwise);
the other modes' headlines go to W&B under ablation/<mode>/. An order whose ranking was arbitrary (every head scored
the same) reports its prunable fraction as prunable_fraction_arbitrary/<order>, apart from the real findings.
"""

import json
from pathlib import Path
from typing import Any

import pandas as pd

from headcount.ablation.results import result_path, run_mode
from headcount.ablation.summary import mode_summary
from headcount.run_dir import RunPaths


def summary_headline(summary: dict, mode: str = "zero") -> dict[str, Any]:
    """The numbers from ablation/summary.json (its section for `mode`) that compare runs: baseline loss and accuracy,
    the prunable fraction per pruning order (arbitrary orders apart), the most important head (the one whose removal
    alone raised the loss most)."""
    section = mode_summary(summary, mode)
    headline = {key: section[key] for key in ("baseline_loss", "baseline_acc") if key in section}
    arbitrary = set(section.get("arbitrary_orders", []))
    for order, fraction in section.get("prunable_fraction", {}).items():
        headline[f"prunable_fraction{'_arbitrary' if order in arbitrary else ''}/{order}"] = fraction
    if top := section.get("most_important_head"):
        headline["most_important_head"] = top["mask"]
        headline["most_important_head_delta_loss"] = top["delta_loss"]
    return headline


def read_summary_json(run_dir: str | Path) -> dict:
    path = RunPaths(Path(run_dir)).ablation / "summary.json"
    return json.loads(path.read_text()) if path.exists() else {}


def run_headline(run_dir: str | Path) -> dict[str, Any]:
    """summary_headline of a run directory, in the mode its config asks for."""
    return summary_headline(read_summary_json(run_dir), run_mode(run_dir))


def log_ablation_results(run_dir: str | Path, wandb_run: Any) -> None:
    """Send <run>/ablation/ to a W&B run: each CSV as a table, each figure as an image, the pruning curves of the run's
    mode as a line plot with one series per order (mean over seeds), and summary.json's headline numbers into the run
    summary (other modes' under ablation/<mode>/)."""
    import wandb

    ablation = RunPaths(Path(run_dir)).ablation
    if not ablation.is_dir():
        return
    mode = run_mode(run_dir)
    logged: dict[str, Any] = {}
    for csv in sorted(ablation.glob("*.csv")):
        if not csv.name.endswith(".partial.csv"):
            logged[f"ablation/table/{csv.stem}"] = wandb.Table(dataframe=pd.read_csv(csv))
    for png in sorted(ablation.glob("*.png")):
        logged[f"ablation/figure/{png.stem}"] = wandb.Image(str(png))
    if (pruning := result_path(ablation, "pruning", mode, ".csv")).exists():
        mean_loss = pd.read_csv(pruning).groupby(["order", "fraction"], sort=False)["loss"].mean()
        orders = list(mean_loss.index.unique("order"))
        logged["ablation/pruning_curves"] = wandb.plot.line_series(
            xs=[mean_loss[order].index.tolist() for order in orders],
            ys=[mean_loss[order].tolist() for order in orders],
            keys=orders,
            title=f"loss (nats) against the fraction of heads pruned, {mode} ablation (mean over seeds)",
            xname="fraction of heads pruned",
        )
    if logged:
        wandb_run.log(logged)
    summary = read_summary_json(run_dir)
    headline = {f"ablation/{key}": value for key, value in summary_headline(summary, mode).items()}
    for other in sorted(set(summary.get("modes", {})) - {mode}):
        headline |= {f"ablation/{other}/{key}": value for key, value in summary_headline(summary, other).items()}
    if headline:
        wandb_run.summary.update(headline)


def log_run_results(run_dir: Path, metrics: dict) -> None:
    """Into this job's W&B run: the final metrics (with the parameter count) and the ablation results."""
    import wandb

    wandb.run.summary.update({key: value for key, value in metrics.items() if value is not None})
    log_ablation_results(run_dir, wandb.run)

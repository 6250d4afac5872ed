"""What a run's results send to W&B: the ablation tables, figures and pruning curves, and the headline numbers that
compare runs in W&B's run table and in sweep reports.

A run's headline comes from the ablation mode and metric its own config asks for (zero and loss unless the experiment
says otherwise; on its task, when it names one); the other sections' headlines go to W&B under ablation/<section>/,
and a task's results under ablation/<task>/. An order whose ranking was arbitrary (every head scored
the same) reports its prunable fraction as prunable_fraction_arbitrary/<order>, apart from the real findings.
"""

from pathlib import Path
from typing import Any

from headcount.ablation.engine.metrics import table_metric
from headcount.ablation.records.address import result_folders, run_address
from headcount.ablation.records.results import read_checked
from headcount.ablation.records.summary import mode_summary, read_summary
from headcount.run_dir import RunPaths


def summary_headline(summary: dict, mode: str = "zero") -> dict[str, Any]:
    """The numbers from a summary.json section (`mode`: its mode and metric, e.g. zero or patch.logit_diff) that
    compare runs: the baseline metric (loss and accuracy for loss), the prunable fraction per pruning order
    (arbitrary orders apart), the most important head (the one whose removal alone worsened the metric most)."""
    section = mode_summary(summary, mode)
    headline = {key: value for key, value in section.items() if key.startswith("baseline_")}
    arbitrary = set(section.get("arbitrary_orders", []))
    for order, fraction in section.get("prunable_fraction", {}).items():
        headline[f"prunable_fraction{'_arbitrary' if order in arbitrary else ''}/{order}"] = fraction
    if top := section.get("most_important_head"):
        headline["most_important_head"] = top["mask"]
        headline |= {f"most_important_head_{key}": value for key, value in top.items() if key.startswith("delta_")}
    return headline


def edge_headline(section: dict) -> dict[str, Any]:
    """A summary.json section's edge scan numbers, per scan name: EAP's and EAP-IG's agreement with the exact scores,
    the largest exact edge, the circuit's faithfulness and each method's CPR and CMD (MIB's areas)."""
    numbers: dict[str, Any] = {}
    for name, entry in section.get("edge_attribution", {}).items():
        for method in ("eap", "eap_ig"):
            agreement = entry.get(method, {})  # or the reason it is not reported, in words: no number to log
            agreement = agreement if isinstance(agreement, dict) else {}
            numbers |= {f"{name}/{method}_{k}": v for k, v in agreement.items() if not isinstance(v, str)}
        if top := entry.get("largest_exact"):
            numbers |= {f"{name}/largest_exact_edge": top["edge"], f"{name}/largest_exact": top["exact"]}
    for name, entry in section.get("edge_circuits", {}).items():
        numbers[f"{name}/circuit_faithfulness"] = entry["circuit_faithfulness"]
        for method, areas in entry.get("mib", {}).items():
            numbers |= {f"{name}/{method}_{key}": areas[key] for key in ("cpr", "cmd")}
    return numbers


def run_headline(run_dir: str | Path) -> dict[str, Any]:
    """summary_headline of a run directory, in the section (and on the task) its config asks for."""
    address = run_address(run_dir)
    return summary_headline(read_summary(address.summary_path), address.section)


def log_ablation_results(run_dir: str | Path, wandb_run: Any) -> None:
    """Send <run>/ablation/ to a W&B run: each CSV as a table, each figure as an image, the pruning curves of the run's
    mode as a line plot with one series per order (mean over seeds), and summary.json's headline numbers and edge scan
    numbers into the run summary (other modes' under ablation/<mode>/)."""
    import wandb

    ablation = RunPaths(Path(run_dir)).ablation
    if not ablation.is_dir():
        return
    configured = run_address(run_dir)
    folders = [(f"ablation/{a.task}" if a.task else "ablation", a) for a in result_folders(ablation)]
    logged: dict[str, Any] = {}
    headline: dict[str, Any] = {}
    for prefix, address in folders:
        folder = address.folder
        for csv in sorted(folder.glob("*.csv")):
            if not csv.name.endswith(".partial.csv"):
                logged[f"{prefix}/table/{csv.stem}"] = wandb.Table(dataframe=read_checked(csv))
        for png in sorted(folder.glob("*.png")):
            logged[f"{prefix}/figure/{png.stem}"] = wandb.Image(str(png))
        summary = read_summary(address.summary_path)
        for section in sorted(summary["modes"]):
            is_headline = folder == configured.folder and section == configured.section
            where = prefix if is_headline else f"{prefix}/{section}"
            headline |= {f"{where}/{key}": value for key, value in summary_headline(summary, section).items()}
            headline |= {
                f"{where}/{key}": value for key, value in edge_headline(mode_summary(summary, section)).items()
            }
    if (pruning := configured.file("pruning", ".csv")).exists():
        curves = read_checked(pruning)
        metric = table_metric(curves)
        mean = curves.groupby(["order", "fraction"], sort=False)[metric.primary].mean()
        section = configured.section
        orders = list(mean.index.unique("order"))
        logged["ablation/pruning_curves"] = wandb.plot.line_series(
            xs=[mean[order].index.tolist() for order in orders],
            ys=[mean[order].tolist() for order in orders],
            keys=orders,
            title=f"{metric.name} ({metric.unit}) against the fraction of heads pruned, {section} (mean over seeds)",
            xname="fraction of heads pruned",
        )
    if logged:
        wandb_run.log(logged)
    if headline:
        wandb_run.summary.update(headline)


def log_run_results(run_dir: Path, metrics: dict) -> None:
    """Into this job's W&B run: the final metrics (with the parameter count) and the ablation results."""
    import wandb

    wandb.run.summary.update({key: value for key, value in metrics.items() if value is not None})
    log_ablation_results(run_dir, wandb.run)

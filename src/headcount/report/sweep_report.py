"""A sweep report: compare the runs of a sweep (`headcount-report <multirun dir>`), from their run directories alone.

Writes <multirun dir>/report/: runs.csv (a row per run: its overrides, parameter count, final metrics, the ablation
headline numbers, finished or not), report.md with the tables and figures (report_figures.py), and with --wandb the
same to a W&B run (offline unless an API key is set). Runs without DONE are marked unfinished and left out of the
means and figures; nothing about them fails the report.
"""

import json
from pathlib import Path

import pandas as pd
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from headcount.errors import ConfigError
from headcount.io import atomic_write_text, writable
from headcount.report import figures as report_figures
from headcount.report.names import short_labels
from headcount.report.runs import sweep_runs
from headcount.report.tracking import run_headline
from headcount.run_dir import RunPaths, is_done
from headcount.train.loggers import closing_wandb_run, wandb_mode

FINAL_METRICS = ["val/loss", "val/acc", "test/loss", "test/acc"]
REPLICATE_KEYS = ["seed"]  # swept for spread, not compared
ARBITRARY_NOTE = (
    "prunable_fraction_arbitrary/<order>: in these runs every head scored the same in that order, so it removed heads "
    "in index order; its prunable fraction is not a finding and is left out of the means and figures."
)


def read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def run_overrides(run_dir: Path) -> dict:
    """The job's overrides as key -> value (`model.attn.n_heads=4` -> 4, `model=tiny` -> "tiny"); lists and mappings
    (`ablation=[single_head,pruning]`) as written, so that they group and sort like the other values."""
    parsed = OverridesParser.create().parse_overrides(list(OmegaConf.load(run_dir / ".hydra" / "overrides.yaml")))
    values = {o.key_or_group: (o, o.value()) for o in parsed if not o.is_delete()}
    return {k: o.get_value_element_as_str() if isinstance(v, list | dict) else v for k, (o, v) in values.items()}


def run_row(run_dir: Path, sweep_dir: Path, overrides: dict) -> dict:
    paths = RunPaths(run_dir)
    metrics = read_json(paths.metrics)
    return {
        "run": str(run_dir.relative_to(sweep_dir)),
        "status": "finished" if is_done(run_dir) else "unfinished",
        **overrides,
        "params": metrics.get("params"),
        **{name: metrics.get(name) for name in FINAL_METRICS},
        **run_headline(run_dir),
    }


def collect_runs(sweep_dir: Path) -> tuple[pd.DataFrame, list[str]]:
    """The runs table and the keys swept in it (override keys whose value differs between runs)."""
    run_dirs = sweep_runs(sweep_dir)
    overrides = [run_overrides(run_dir) for run_dir in run_dirs]
    runs = pd.DataFrame([run_row(run_dir, sweep_dir, o) for run_dir, o in zip(run_dirs, overrides)])
    override_keys = {key for o in overrides for key in o}
    swept = [k for k in runs.columns if k in override_keys and runs[k].astype(str).nunique() > 1]
    return runs, swept


def compared_metrics(runs: pd.DataFrame) -> list[str]:
    candidates = ["test/loss", "test/acc"] + [c for c in runs.columns if c.startswith("prunable_fraction/")]
    return [c for c in candidates if c in runs and runs[c].notna().any()]


def mean_over_seeds(runs: pd.DataFrame, configs: list[str], metrics: list[str]) -> pd.DataFrame:
    """A row per configuration: how many finished runs it has and each metric as mean ± standard deviation."""
    if not configs:
        runs = runs.assign(configuration="all runs")
        configs = ["configuration"]
    grouped = runs.groupby(configs, dropna=False, sort=True)
    table = grouped.size().rename("runs").to_frame()
    for metric in ["params", *metrics]:
        stats = grouped[metric].agg(["mean", "std"])
        table[metric] = [format_value(m) + ("" if pd.isna(s) else f" ± {s:.2g}") for m, s in stats.to_numpy()]
    return table.reset_index()


def format_value(value) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def markdown_table(table: pd.DataFrame) -> str:
    """A GitHub markdown table (pandas' to_markdown would need the tabulate package for this alone)."""

    def cell(value) -> str:
        return format_value(value).replace("|", "\\|")

    lines = ["| " + " | ".join(map(str, table.columns)) + " |", "|" + " --- |" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)


def configuration_keys(swept: list[str]) -> list[str]:
    """The swept keys that tell configurations apart; the others (seeds) replicate a configuration."""
    return [k for k in swept if k not in REPLICATE_KEYS]


def draw_figures(finished: pd.DataFrame, sweep_dir: Path, out: Path, swept: list[str]) -> dict[str, Path]:
    """Section title -> figure path, for the figures this sweep has data for."""
    configs = configuration_keys(swept)
    metrics = compared_metrics(finished)
    subject = report_figures.sweep_subject(finished, sweep_dir)
    figures: dict[str, Path | None] = {}
    for key in configs if metrics else []:
        others = [k for k in configs if k != key]
        path = out / f"metrics_vs_{key}.png"
        figures[f"Metrics against {key}"] = report_figures.metrics_against(
            finished, key, others, metrics, path, subject
        )
    figures["Pruning curves"] = report_figures.pruning_curves(
        finished, sweep_dir, configs, out / "pruning_curves.png", subject
    )
    figures[report_figures.single_head_title(finished, sweep_dir)] = report_figures.single_head_grid(
        finished, sweep_dir, configs, out / "single_head_heatmaps.png", subject
    )
    return {title: path for title, path in figures.items() if path is not None}


def report_markdown(sweep_dir: Path, runs: pd.DataFrame, swept: list[str], figures: dict[str, Path]) -> str:
    finished = runs[runs["status"] == "finished"]
    configs = configuration_keys(swept)
    swept_text = ", ".join(
        f"`{k}` ({', '.join(map(str, sorted(runs[k].dropna().unique(), key=report_figures.sort_key)))})" for k in swept
    )
    lines = [
        f"# Sweep report: {sweep_dir.name}",
        "",
        f"`{sweep_dir}`: {len(runs)} runs, {len(finished)} finished, {len(runs) - len(finished)} unfinished.",
        f"Swept: {swept_text or 'nothing (the runs share all their overrides)'}.",
        "",
    ]
    if len(finished):
        lines += [
            "## Mean over seeds (finished runs)",
            "",
            markdown_table(mean_over_seeds(finished, configs, compared_metrics(finished))),
            "",
        ]
    lines += [
        "## Runs",
        "",
        markdown_table(runs.drop(columns=[c for c in runs if c not in report_columns(runs, swept)])),
        "",
    ]
    if any(c.startswith("prunable_fraction_arbitrary/") for c in runs.columns):
        lines += [ARBITRARY_NOTE, ""]
    for title, path in figures.items():
        lines += [f"## {title}", "", f"![{title}]({path.name})", ""]
    return "\n".join(lines)


def report_columns(runs: pd.DataFrame, swept: list[str]) -> list[str]:
    """What the markdown runs table shows: the run, its status, the swept values and the results (runs.csv has all)."""
    results = ["params", *FINAL_METRICS, "baseline_loss", "most_important_head"]
    results += [c for c in runs.columns if c.startswith(("prunable_fraction/", "prunable_fraction_arbitrary/"))]
    return ["run", "status", *swept, *(c for c in results if c in runs)]


def write_report(sweep_dir: Path, out: Path | None = None) -> tuple[Path, pd.DataFrame, dict[str, Path]]:
    """Write the report into out (default <sweep_dir>/report/); returns the folder, the runs table and the figures.
    The runs are only read: a sweep on read-only storage is reported into a folder elsewhere."""
    runs, swept = collect_runs(sweep_dir)
    out = sweep_dir / "report" if out is None else out
    if not writable(out):
        key, value = ("sweep_dir", str(sweep_dir)) if out == sweep_dir / "report" else ("--out", str(out))
        raise ConfigError(
            key, value, f"{out} cannot be written (read-only storage?): write the report elsewhere with --out DIR"
        )
    finished = runs[runs["status"] == "finished"]
    figures = draw_figures(finished, sweep_dir, out, swept) if len(finished) else {}
    atomic_write_text(out / "runs.csv", runs.to_csv(index=False))
    atomic_write_text(out / "report.md", report_markdown(sweep_dir, runs, swept, figures))
    return out, runs, figures


def wandb_project_of(runs: pd.DataFrame, sweep_dir: Path) -> str:
    """The W&B project the sweep's runs were configured with (the first run's), else headcount's default."""
    config = OmegaConf.load(RunPaths(sweep_dir / runs["run"].iloc[0]).config)
    return OmegaConf.select(config, "logger.wandb.project", default=None) or "headcount"


def push_to_wandb(out: Path, runs: pd.DataFrame, figures: dict[str, Path], project: str, group: str) -> None:
    """The runs table and the figures as one W&B run of job type `report`, in the sweep's group."""
    import wandb

    mode = wandb_mode("auto")
    with closing_wandb_run():
        run = wandb.init(project=project, group=group, job_type="report", name=f"report {group}", dir=out, mode=mode)
        table = runs.astype({c: str for c in runs.columns if runs[c].dtype == object})  # W&B wants one type a column
        images = {f"report/{path.stem}": wandb.Image(str(path)) for path in figures.values()}
        run.log({"report/runs": wandb.Table(dataframe=table), **images})


def swept_columns(runs: pd.DataFrame) -> list[str]:
    """The runs table's override columns (run_row puts them between status and params) whose value differs."""
    columns = list(runs.columns)
    overrides = columns[columns.index("status") + 1 : columns.index("params")]
    return [c for c in overrides if runs[c].astype(str).nunique() > 1]


def print_summary(out: Path, runs: pd.DataFrame) -> None:
    """A table of the runs that fits a terminal of 80 columns: a column per swept key under its short label (with a
    legend for the shortened ones), the status and the test loss; long values wrap rather than being cut."""
    console = Console(stderr=True)
    swept = swept_columns(runs)
    labels = short_labels(swept)
    table = Table(title=f"{len(runs)} runs")
    for key in swept or ["run"]:
        table.add_column(escape(labels.get(key, key)), overflow="fold")
    table.add_column("status")
    table.add_column("test/loss", justify="right")
    for _, row in runs.iterrows():
        status = "[green]finished[/green]" if row["status"] == "finished" else "[yellow]unfinished[/yellow]"
        table.add_row(
            *(escape(format_value(row[key])) for key in swept or ["run"]), status, format_value(row["test/loss"])
        )
    console.print(table)
    legend = [f"{labels[key]} = {key}" for key in swept if labels[key] != key]
    if legend:
        console.print(escape("columns: " + ", ".join(legend)), soft_wrap=True, highlight=False)
    console.print(
        f"[green]wrote[/green] {escape(str(out / 'report.md'))}, {escape(str(out / 'runs.csv'))} and the figures "
        "beside them",
        soft_wrap=True,
        highlight=False,
    )

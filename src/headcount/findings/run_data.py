"""What a finding reads from a finished run beyond the model (headcount.run_dir.load_run): its result files, in the
ablation mode its config asks for (zero unless the experiment says otherwise), the zero-ablation evaluator on its
evaluation batches, and what its figures say they show."""

from collections.abc import Callable
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf
from torch import Tensor

from headcount.ablation.evaluator import MaskEvaluator
from headcount.ablation.results import configured_results, read_checked, result_path, run_mode
from headcount.ablation.summary import read_mode_summary
from headcount.report.captions import describe_model, describe_run
from headcount.run_dir import FinishedRun, load_run_config


def run_evaluator(run: FinishedRun, loss_mask: Callable[[Tensor], Tensor] | None = None) -> MaskEvaluator:
    """Zero ablation on the run's ablation batches; loss_mask (a function of a batch's loss_mask) scores other
    positions."""
    batches = run.eval_batches()
    if loss_mask is not None:
        batches = [{**batch, "loss_mask": loss_mask(batch["loss_mask"])} for batch in batches]
    return MaskEvaluator(run.model, batches)


def scan_results(run_dir: Path, scans: list[str]) -> tuple[dict, list[pd.DataFrame]]:
    """A finished run's summary.json section and the CSVs of the named scans, in the run's ablation mode and metric
    (on its task, when its config names one)."""
    folder, section = configured_results(run_dir)
    return read_mode_summary(folder, section), [read_checked(scan_file(run_dir, scan, ".csv")) for scan in scans]


def scan_file(run_dir: Path, scan: str, ext: str, mode_independent: bool = False) -> Path:
    """A scan's result file in the run's ablation mode and metric (plain names for a mode-independent scan)."""
    folder, section = configured_results(run_dir)
    return result_path(folder, scan, None if mode_independent else section, ext)


def run_subject(run_dir: Path, mode: str | None = None) -> str:
    """The second line of a finding figure's title: the model, the data (or the task) and the ablation mode."""
    config = load_run_config(run_dir)
    section = mode or run_mode(run_dir)
    ablation_mode, _, metric = section.partition(".")
    measured = f"{ablation_mode} ablation" + (f" measured by {metric}" if metric else "")
    task = OmegaConf.select(config, "task.source", default=None)
    if task is not None:
        return f"{describe_model(config, run_dir)}, task {configured_results(run_dir, config)[0].name}, {measured}"
    return f"{describe_run(config, run_dir)}, {measured}"

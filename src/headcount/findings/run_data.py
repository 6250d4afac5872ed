"""What a finding reads from a finished run beyond the model (headcount.run_dir.load_run): its result files, and the
zero-ablation evaluator on its evaluation batches."""

import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd
from torch import Tensor

from headcount.ablation.evaluator import MaskEvaluator
from headcount.run_dir import FinishedRun, RunPaths


def run_evaluator(run: FinishedRun, loss_mask: Callable[[Tensor], Tensor] | None = None) -> MaskEvaluator:
    """Zero ablation on the run's ablation batches; loss_mask (a function of a batch's loss_mask) scores other
    positions."""
    batches = run.eval_batches()
    if loss_mask is not None:
        batches = [{**batch, "loss_mask": loss_mask(batch["loss_mask"])} for batch in batches]
    return MaskEvaluator(run.model, batches)


def scan_results(run_dir: Path, scans: list[str]) -> tuple[dict, list[pd.DataFrame]]:
    """A finished run's ablation/summary.json and the CSVs of the named scans."""
    ablation = RunPaths(run_dir).ablation
    summary = json.loads((ablation / "summary.json").read_text())
    return summary, [pd.read_csv(ablation / f"{scan}.csv") for scan in scans]

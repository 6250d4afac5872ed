"""What a finding reads from a finished run beyond the model (headcount.run_dir.load_run): its result files, at the
address its config asks for (ablation/records/address.py: its mode, metric and task), the zero-ablation evaluator on its
evaluation batches, and what its figures say they show."""

from collections.abc import Callable
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf
from torch import Tensor

from headcount.ablation.engine.evaluator import MaskEvaluator
from headcount.ablation.records.address import ResultAddress, run_address
from headcount.ablation.records.results import read_checked
from headcount.ablation.records.summary import read_mode_summary
from headcount.ablation.scans.base import configured_variant
from headcount.captions import describe_model, describe_run
from headcount.run_dir import FinishedRun, RunPaths, load_run_config


def run_evaluator(run: FinishedRun, loss_mask: Callable[[Tensor], Tensor] | None = None) -> MaskEvaluator:
    """Zero ablation on the run's ablation batches; loss_mask (a function of a batch's loss_mask) scores other
    positions."""
    batches = run.eval_batches()
    if loss_mask is not None:
        batches = [{**batch, "loss_mask": loss_mask(batch["loss_mask"])} for batch in batches]
    return MaskEvaluator(run.model, batches)


def scan_results(run_dir: Path, scans: list[str]) -> tuple[dict, list[pd.DataFrame]]:
    """A finished run's summary.json section and the CSVs of the named scans, at the address its config asks for
    (its ablation mode and metric, on its task when it names one, each scan's own variant: top_heads' rank_by)."""
    config = saved_config(run_dir)
    address = run_address(run_dir, config)
    tables = [read_checked(address.file(s, ".csv", scan_variant=configured_variant(config, s))) for s in scans]
    return read_mode_summary(address.folder, address.section), tables


def scan_file(run_dir: Path, scan: str, ext: str, mode_independent: bool = False) -> Path:
    """A scan's result file at the address the run's config asks for (plain names for a mode-independent scan), with
    the scan's own variant as the config sets it."""
    config = saved_config(run_dir)
    return run_address(run_dir, config).file(scan, ext, mode_independent, configured_variant(config, scan))


def saved_config(run_dir: Path) -> DictConfig:
    """The run's .hydra/config.yaml; empty for a folder of results alone (the addresses' defaults then apply)."""
    path = RunPaths(Path(run_dir)).config
    return OmegaConf.load(path) if path.exists() else OmegaConf.create({})


def run_subject(run_dir: Path, address: ResultAddress | None = None) -> str:
    """The second line of a finding figure's title: the model, the data (or the task) and the ablation mode of the
    results at `address` (default: the address the run's config asks for)."""
    config = load_run_config(run_dir)
    address = address or run_address(run_dir, config)
    measured = f"{address.mode} ablation" + (f" measured by {address.metric}" if address.names_metric else "")
    if address.task:
        return f"{describe_model(config, run_dir)}, task {address.task}, {measured}"
    return f"{describe_run(config, run_dir)}, {measured}"

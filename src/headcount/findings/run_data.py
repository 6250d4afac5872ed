"""What a finding needs from a finished run beyond its CSVs: the model and its evaluation batches."""

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf

from headcount.ablation.evaluator import MaskEvaluator
from headcount.ablation.examples import split_examples, to_batches
from headcount.config.data import DataConfig
from headcount.model import Transformer
from headcount.run_dir import RunPaths, finished_checkpoint, load_model, load_run_config


@dataclass
class FinishedRun:
    config: DictConfig
    model: Transformer
    batches: list[dict[str, torch.Tensor]]  # the ablation split, as the scans saw it

    @classmethod
    def load(cls, run_dir: Path) -> "FinishedRun":
        from headcount.data import HeadcountDataModule

        cfg = load_run_config(run_dir)
        model = load_model(finished_checkpoint(run_dir)).eval()
        data = HeadcountDataModule(OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DataConfig), cfg.data)))
        data.setup()
        a = cfg.ablation
        examples = split_examples(data.splits, a.split, a.n_eval, "ablation.split")
        return cls(cfg, model, to_batches(examples, a.batch_size, torch.device("cpu")))

    def evaluator(self, loss_mask=None) -> MaskEvaluator:
        """Zero ablation on the run's batches; loss_mask (a function of a batch's loss_mask) scores other positions."""
        batches = self.batches
        if loss_mask is not None:
            batches = [{**batch, "loss_mask": loss_mask(batch["loss_mask"])} for batch in batches]
        return MaskEvaluator(self.model, batches)


def scan_results(run_dir: Path, scans: list[str]) -> tuple[dict, list[pd.DataFrame]]:
    """A finished run's ablation/summary.json and the CSVs of the named scans."""
    ablation = RunPaths(run_dir).ablation
    summary = json.loads((ablation / "summary.json").read_text())
    return summary, [pd.read_csv(ablation / f"{scan}.csv") for scan in scans]

"""run_ablations: every scan the ablation section lists, on one finished run, with results in <run>/ablation/.

A session opens the run once (headcount.run_dir.load_run), checks the settings and what they name against the model
before any work, prepares the replacements and the evaluator, computes the baseline, then runs the scans in the order
given through their kinds (ablation/scans/), and finally the structural export if asked. Scans that others need
(single_head for pairs' top_k and the single_head pruning order, pruning for a prunable-fraction export) run on demand
under their kind's name. Before any work, the data is checked against what the run trained on (ablation/data_check.py).
Every result carries a fingerprint of what it depends on (the model's weights, the data's content, the ablation
settings, the masks): a scan whose CSV is up to date is read back rather than rerun, and an interrupted one resumes
from its partial file. Each mode keeps its own files and its own section of summary.json (ablation/results.py).
"""

from pathlib import Path
from typing import Any

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor

from headcount.ablation.data_check import checked_data
from headcount.ablation.evaluation import evaluation, evaluation_set
from headcount.ablation.export import check_export, export_pruned_model
from headcount.ablation.importance import Importance, importance_under
from headcount.ablation.results import ResultFiles, fingerprint, model_fingerprint
from headcount.ablation.scans import KINDS, Scan, validate_scans
from headcount.config.ablation import AblationConfig, ScanConfig, validate_ablation_config
from headcount.run_dir import RunPaths, describe_run, load_run, read_pretrained


def run_ablations(cfg: DictConfig, run_dir: str | Path) -> list[Path]:
    """Run cfg.ablation's scans (and the pruned export, if asked) on the finished run in run_dir; cfg is a train
    config (model, data, seed, ablation). Returns the files written."""
    session = AblationSession(cfg, Path(run_dir))
    for scan in session.scans.values():
        scan.run()
    if session.settings.prune.export:
        export_pruned_model(session)
    return session.files.written


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def typed_ablation(section: DictConfig) -> AblationConfig:
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(AblationConfig), section))


class AblationSession:
    """What every scan of one run shares: the settings, the model and its evaluator on the eval batches, the
    replacements, the baseline, the result files, and what scans have handed to others (`shared`)."""

    def __init__(self, cfg: DictConfig, run_dir: Path):
        self.settings = s = typed_ablation(cfg.ablation)
        validate_ablation_config(s)
        validate_scans(s)
        self.run = load_run(run_dir, cfg)
        self.out = RunPaths(run_dir).ablation
        self.device = resolve_device(s.device)
        model_key = model_fingerprint(self.run.model)
        self.model = self.run.model.to(self.device, torch.float32).eval()
        self.heads_per_layer = self.model.heads_per_layer
        self.subject = describe_run(self.run.config, run_dir)
        # Everything a file or a head list can get wrong is checked before any work starts.
        self.scans = {name: self.new_scan(name, scan) for name, scan in s.scans.items()}
        for scan in self.scans.values():
            scan.prepare()
        check_export(s.prune, self.heads_per_layer)
        data = checked_data(run_dir, self.run, s.allow_data_change)

        eval_set = evaluation_set(self.run, s)
        examples, reference = eval_set.examples, eval_set.reference
        n_eval = len(examples["input_ids"])
        settings_record = {
            "mode": s.mode,
            "split": s.split,
            "n_eval": n_eval,
            **({} if reference is None else {"reference_split": s.reference_split}),
            **({} if reference is None else {"n_reference": len(reference["input_ids"])}),
            **({"mean_per_position": s.mean_per_position} if s.mode == "mean" else {}),
            **({"seed": s.seed} if s.mode == "resample" else {}),
        }
        self.key = fingerprint(model_key, data["fingerprint"], settings_record)
        self.eval_key = fingerprint(model_key, data["fingerprint"], {"split": s.split, "n_eval": n_eval})
        self.files = ResultFiles(self.out, s.mode, self.key)
        evaluated = evaluation(s, self.model, eval_set, self.files, self.device)
        self.replacements, self.batches, self.evaluator = evaluated.replacements, evaluated.batches, evaluated.evaluator
        self.baseline = self.evaluator.baseline()
        self.record = {
            "mode": s.mode,
            "split": s.split,
            "n_eval": n_eval,
            "n_targets": self.baseline["n_targets"],
            "reference_split": settings_record.get("reference_split"),
            "n_reference": settings_record.get("n_reference"),
        }
        self.files.open(
            {
                "model": model_key,
                "data": data,
                "settings": settings_record,
                "baseline_loss": self.baseline["loss"],
                "baseline_acc": self.baseline["acc"],
                "n_targets": self.baseline["n_targets"],
                **({"pretrained": pretrained["provenance"]} if (pretrained := read_pretrained(run_dir)) else {}),
            }
        )
        self.shared: dict[str, Any] = {}  # scan kind -> what its last run here handed to other scans

    def new_scan(self, name: str, cfg: ScanConfig) -> Scan:
        return KINDS[cfg.kind](name, cfg, self)

    def provided(self, kind: str, compute: bool = True) -> Any:
        """What a scan of this kind hands to others, from this session's run of it, else from its up-to-date
        results under its kind's name; failing both, runs it under that name, or with compute=False returns None."""
        if kind not in self.shared:
            scan = self.new_scan(kind, ScanConfig(kind=kind))
            if compute or scan.read_back(announce=False) is not None:
                scan.run()
        return self.shared.get(kind)

    def importance(self, mask_LH: Tensor) -> Importance:
        """Gradient importance at gates mask_LH, on the eval batches, under this session's replacements."""
        s = self.settings
        return importance_under(self.model, self.batches, self.replacements, s.normalize_importance, mask_LH)

    def layer_head_tensor(self, table: pd.DataFrame, column: str) -> Tensor:
        """(L, H) float64 from a table's layer, head and `column`; 0 where a head has no row."""
        values_LH = torch.zeros(self.model.n_layers, self.model.max_heads, dtype=torch.float64)
        values_LH[table["layer"].tolist(), table["head"].tolist()] = torch.tensor(table[column].tolist()).double()
        return values_LH

"""What a scan (and the structural export) may use of the session that runs it, as a Protocol: scans depend on this
contract, not on the session module, so the session can import the scans without an import cycle."""

from pathlib import Path
from typing import Any, Protocol

import pandas as pd
import torch
from torch import Tensor

from headcount.ablation.evaluator import MaskEvaluator
from headcount.ablation.importance import Importance
from headcount.ablation.replacements import Replacements
from headcount.ablation.results import ResultFiles
from headcount.config.ablation import AblationConfig
from headcount.model import Transformer
from headcount.run_dir import FinishedRun


class ScanContext(Protocol):
    settings: AblationConfig
    run: FinishedRun  # the finished run: its config, checkpoint, model and data splits
    out: Path  # <run>/ablation
    device: torch.device
    model: Transformer  # on `device`, in eval mode
    heads_per_layer: list[int]
    key: str  # the fingerprint of the model's weights, the data and the ablation settings every result depends on
    eval_key: str  # the same without the mode's settings: what a mode-independent result depends on
    subject: str  # the model and the data, for figure titles
    record: dict  # the constant columns every result table ends with (mode, splits, sizes, targets)
    files: ResultFiles
    replacements: Replacements
    batches: list[dict[str, Tensor]]  # the evaluation split, on `device`
    evaluator: MaskEvaluator
    baseline: dict[str, float]
    shared: dict[str, Any]  # scan kind -> what its last run in this session handed to other scans

    def provided(self, kind: str, compute: bool = True) -> Any:
        """What a scan of this kind hands to others: from this session, from its up-to-date results, or computed."""

    def importance(self, mask_LH: Tensor) -> Importance:
        """Gradient importance at gates mask_LH under the session's replacements."""

    def layer_head_tensor(self, table: pd.DataFrame, column: str) -> Tensor:
        """(L, H) float64 from a table's layer, head and `column`."""

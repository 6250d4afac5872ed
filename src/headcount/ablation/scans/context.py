"""What a scan (and the structural export) may use of the session that runs it, as a Protocol: scans depend on this
contract, not on the session module, so the session can import the scans without an import cycle."""

from typing import Any, Protocol

import pandas as pd
import torch
from torch import Tensor

from headcount.ablation.engine.evaluation import CounterpartSums
from headcount.ablation.engine.evaluator import MaskEvaluator
from headcount.ablation.engine.metrics import Metric
from headcount.ablation.engine.modes import AblationMode, Replacements
from headcount.ablation.methods.importance import Importance
from headcount.ablation.records.address import ResultAddress
from headcount.ablation.records.distributed import ScanWorld
from headcount.ablation.records.results import ResultFiles
from headcount.config.ablation import AblationConfig
from headcount.model import Transformer
from headcount.run_dir import FinishedRun
from headcount.tasks import TaskSet


class ScanContext(Protocol):
    settings: AblationConfig
    mode: AblationMode  # what an ablated head's z becomes
    metric: Metric  # what a mask is measured by
    address: ResultAddress  # where the results live: folder, file names, section (ablation/records/address.py)
    run: FinishedRun  # the finished run: its config, checkpoint, model and data splits
    task: TaskSet | None  # the task masks are evaluated on, None for the run's own data
    positions: list[str]  # the task's named positions (the columns of a batch's named_pos)
    device: torch.device
    model: Transformer  # on `device`, in eval mode
    key: str  # the fingerprint of the model's weights, the data and the ablation settings every result depends on
    eval_key: str  # the same without the mode's settings: what a mode-independent result depends on
    subject: str  # the model and the data, for figure titles
    record: dict  # the constant columns every result table ends with (mode, splits, sizes, targets)
    files: ResultFiles
    replacements: Replacements
    batches: list[dict[str, Tensor]]  # the evaluation split, on `device`
    evaluator: MaskEvaluator
    baseline: dict[str, float]  # each metric column of the unmasked model, and n_targets
    counterpart: dict[str, float] | None  # the same on a task's counterpart prompts (the gap's other end), or None
    counterpart_sums: CounterpartSums | None  # that, with each counterpart's sums: the gap's bootstrap units
    world: ScanWorld | None  # the processes mask evaluations are shared out over; None for this one alone

    def provided(self, kind: str, compute: bool = True) -> Any:
        """What a scan this one declared it needs (Scan.needs: a kind, or a ranking scan's name) handed over; with
        compute=False, what an optional reader may find: this session's run, an up-to-date result, or None."""

    def hand(self, name: str, value: Any) -> None:
        """What this scan's result hands to the scans that need it, under its kind (or its name, for a ranking)."""

    def importance(self, mask_LH: Tensor, per_example: bool = False) -> Importance:
        """Gradient importance of the metric at gates mask_LH under the session's replacements."""

    def layer_head_tensor(self, table: pd.DataFrame, column: str) -> Tensor:
        """(L, H) float64 from a table's layer, head and `column`."""

"""What a scan (and the structural export) may use of the session that runs it, as a Protocol: scans depend on this
contract, not on the session module, so the session can import the scans without an import cycle.

Each scan sees only what its kind declares of it: `Scan.reads` names the attributes and methods it reads, `Scan.needs`
(and `Scan.optional_needs`) the scans whose results it reads. A scan holds a `DeclaredContext`, which hands over the
declared reads and refuses any other at once, naming the scan and the read it did not declare (`UndeclaredRead`)."""

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


# what the cached-result step (Scan.run: file names, fingerprint, record columns, figure titles, the processes)
# reads for every kind, and what every kind may do: hand its result over, read the results it declares it needs
EVERY_SCAN_READS = frozenset(
    {"settings", "metric", "address", "key", "eval_key", "subject", "record", "files", "world", "hand", "provided"}
)


def offered() -> frozenset[str]:
    """Every read a scan can declare: the ScanContext's attributes and methods."""
    methods = {name for name in vars(ScanContext) if not name.startswith("_")}
    return frozenset(ScanContext.__annotations__) | methods


class UndeclaredRead(RuntimeError):
    """A scan read something of the session its kind did not declare (a programming error, not a setting's)."""


class DeclaredContext:
    """What one scan sees of the session (or of what stands in for it before training: cli/preflight.py's
    ModelShape): the reads its kind declares (`Scan.reads`), forwarded; the results of the scans it declares it needs
    (`provided`); a needed scan's own context, for the checks of a scan it needs (top_heads prepares its ranking's).
    Anything else fails at once with `UndeclaredRead` naming the scan and the read."""

    def __init__(self, session: Any, scan: Any):  # scan: a Scan (base.py imports this module)
        self._session, self._scan = session, scan

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and friends ask for dunders: no read of the session
            raise AttributeError(name)
        scan = self._scan
        if name not in type(scan).reads:
            what = "which a scan context does not offer" if name not in offered() else "without declaring it"
            raise UndeclaredRead(
                f"scan {scan.name!r} ({scan.kind}) reads the session's `{name}` {what}: "
                f"{type(scan).__name__}.reads declares {', '.join(sorted(type(scan).reads))}"
            )
        return getattr(self._session, name)

    def provided(self, kind: str, compute: bool = True) -> Any:
        """The session's `provided`, for a scan this one declared it needs (with compute=False, or optionally)."""
        scan = self._scan
        self.require(kind, scan.needs() if compute else [*scan.needs(), *scan.optional_needs()])
        return self._session.provided(kind, compute)

    def for_needed(self, needed: Any) -> "DeclaredContext":
        """The context of a scan this one declared it needs (or reads optionally), built to check or read it back."""
        scan = self._scan
        self.require(needed.name, [*scan.needs(), *scan.optional_needs()], needed.kind)
        return DeclaredContext(self._session, needed)

    def require(self, need: str, declared: list[str], kind: str | None = None) -> None:
        if need not in declared and kind not in declared:
            scan = self._scan
            raise UndeclaredRead(
                f"scan {scan.name!r} ({scan.kind}) reads the result of {need!r} without declaring it needs it: "
                f"{type(scan).__name__}.needs gives {', '.join(declared) or 'none'}"
            )

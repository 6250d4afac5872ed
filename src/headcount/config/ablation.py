"""The ablation section of the train and ablate configs, and the checks on it that need no model or data, so bad
input fails before any work starts."""

import re
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, open_dict

from headcount.config.choice import Choice, check_bools, check_choice
from headcount.errors import ConfigError, check_positive, check_seed, finite

if TYPE_CHECKING:
    import torch

# Where an l0_gates scan nests L0GatesConfig (ablation/scans/l0_gates.py), for error messages.
KEY = "ablation.scans.l0_gates.l0"


@dataclass
class L0GatesConfig:
    steps: int = 500  # optimiser steps, cycling through the batches
    lr: float = 0.1  # Adam on log_alpha
    n_batches: int | None = None  # train on the first n of the given batches (None: all)
    beta: float = 2 / 3  # hard-concrete temperature
    gamma: float = -0.1  # lower stretch limit, < 0
    zeta: float = 1.1  # upper stretch limit, > 1
    penalty: float | None = 0.05  # fixed lambda per expected open head; with target_heads, lambda's start (null: 0)
    # Heads to keep: an int, a list (one run per target: the loss-against-heads-kept curve) or null (fixed penalty).
    # Any, not a Union: OmegaConf structured configs accept no list-or-int type.
    target_heads: Any = None
    penalty_lr: float = 0.002  # dual-ascent step on lambda per head of constraint violation
    target_warmup: float = 0.5  # fraction of the steps over which the target falls from all heads to target_heads
    log_alpha_init: float = 3.0  # sigmoid(3) (zeta - gamma) + gamma = 1.04: every gate starts open
    seed: int = 0  # the hard-concrete noise


class ScanDtype(Choice):
    """The weights' and activations' precision during a scan (ablation.dtype)."""

    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"

    @property
    def torch(self) -> "torch.dtype":
        import torch  # the commands check a config before torch loads (cli/): only a scan asks for the dtype

        return getattr(torch, self.value)


class PatchDirection(Choice):
    noise = "noise"  # run the clean prompt, patch in the corrupted prompt's z
    denoise = "denoise"  # run the corrupted prompt, patch in the clean prompt's z


class PatchPositions(Choice):
    all = "all"  # a mask replaces a head's z at every position
    each = "each"  # masks per head and named position of the task (ioi: IO, S1, S1+1, S2, end)


class PruningOrder(Choice):
    gradient = "gradient"
    gradient_per_example = "gradient_per_example"  # Michel et al.'s own definition: the expectation over examples
    gradient_iterative = "gradient_iterative"
    single_head = "single_head"
    random = "random"


class ExportOrder(Choice):
    """What ablation.prune.order may name: a pruning order, or the heads the learned L0 gates keep."""

    gradient = "gradient"
    gradient_per_example = "gradient_per_example"
    gradient_iterative = "gradient_iterative"
    single_head = "single_head"
    random = "random"
    l0_gates = "l0_gates"


DEFAULT_ORDERS = (PruningOrder.gradient, PruningOrder.gradient_iterative, PruningOrder.single_head, PruningOrder.random)


@dataclass
class PruningConfig:
    step: float = 0.1  # fraction of all heads removed per step
    orders: list[PruningOrder] = field(default_factory=lambda: list(DEFAULT_ORDERS))
    random_seeds: int = 3
    tolerance: float = 0.01  # prunable = loss within (1 + tolerance) * baseline loss


@dataclass
class PruneExportConfig:
    export: bool = False  # write ablation/pruned.ckpt, a smaller model with the heads removed
    # Remove the largest prunable fraction found by this pruning order, or with `l0_gates` the heads the l0_gates
    # scan's learned gates close...
    order: ExportOrder = ExportOrder.gradient
    fraction: float | None = None  # ...or exactly this fraction in that pruning order...
    heads: list[list[int]] | None = None  # ...or exactly these [layer, head] pairs
    l0_target_heads: int | None = None  # order=l0_gates with several targets: the run whose mask to export


# A key one mode alone reads (its `own_keys`, ablation/engine/modes.py): refused under another mode, and not carried
# from a run's saved settings into another mode (mode_setting_keys).
MODE_SETTING = {"mode_setting": True}


@dataclass
class AblationConfig:
    # What an ablated head's z becomes: a mode's name (ablation/engine/modes.py defines them; headcount-ablate --list)
    mode: str = "zero"
    mean_per_position: bool = field(default=False, metadata=MODE_SETTING)  # mean: z averaged per position
    # What a mask is measured by: a metric name (loss, accuracy, logit_diff, answer_logprob, answer_prob, top1), or
    # {_target_: module.function, name: ..., higher_is_better: ...} for your own (ablation/engine/metrics.py). null:
    # loss on the run's data; on a task, logit_diff when it has wrong answers, else answer_logprob. Any, not a Union:
    # OmegaConf structured configs take no str-or-dict type.
    metric: Any = None
    patch_direction: PatchDirection = field(default=PatchDirection.noise, metadata=MODE_SETTING)  # noise or denoise
    patch_positions: PatchPositions = PatchPositions.all  # mode=patch and attribution: all positions, or each named one
    split: str = "val"  # the split every mask is evaluated on (a task: its prompts)
    # Where mean and resample replacements come from: a split (null: train), or on a task its prompts or corrupted
    # (null: prompts)
    reference_split: str | None = None
    n_eval: int | None = None  # examples of `split` to evaluate on (None: all)
    n_reference: int = 512  # examples of `reference_split` for the means
    batch_size: int = 64  # examples per forward pass (times masks per pass)
    masks_per_pass: int | None = None  # None: as many as fit the memory budget
    memory_budget_mb: int | None = None  # activations per pass (None: max(64 MiB, weights) on CPU, half the free CUDA)
    device: str = "auto"  # auto | cpu | cuda
    # The weights and activations of the scans: float32, or bfloat16 / float16 for a model that does not fit (half the
    # memory; the memory budget counts it). Metrics are still read in float32 and summed in float64; results in
    # another dtype than float32 record it (summary.json and the tables' dtype column).
    dtype: ScanDtype = ScanDtype.float32
    seed: int = 0  # resample pairing and random pruning orders
    # Seeds of the task generator (e.g. [0,1,2]): the mask scans run again on the task drawn with each, and their
    # top heads compared across seeds (ablation/task_seeds.py); null: none. Any: checked by ablation/task_seeds.py.
    task_seeds: Any = None
    normalize_importance: bool = True  # per-layer l2 normalisation of gradient importance (Michel et al.)
    progress: bool = True
    # Ablate although the data differs from what the run trained on (recorded in summary.json); off: refuse.
    allow_data_change: bool = False
    # Scans to run, keyed by name; filled by selecting configs from conf/ablation/. Each entry's keys are its kind's
    # (a `ScanSettings` class beside the kind, headcount/ablation/scans/<kind>.py), typed by ablation/scans/base.py's
    # typed_scan: this layer does not know the kinds.
    scans: dict[str, Any] = field(default_factory=dict)
    pruning: PruningConfig = field(default_factory=PruningConfig)
    prune: PruneExportConfig = field(default_factory=PruneExportConfig)


def mode_setting_keys() -> list[str]:
    """The keys of the ablation section that one mode alone reads (MODE_SETTING)."""
    return [f.name for f in fields(AblationConfig) if f.metadata.get("mode_setting")]


def l0_targets(cfg: L0GatesConfig) -> list[int | None]:
    """The runs a config asks for: one per target, or a single fixed-penalty run (None)."""
    if cfg.target_heads is None:
        return [None]
    return [cfg.target_heads] if isinstance(cfg.target_heads, int) else list(cfg.target_heads)


def validate_l0_config(cfg: L0GatesConfig, n_heads: int | None = None, key: str = KEY) -> None:
    """ConfigError for values training cannot use; given n_heads (the model's heads), every target must fit in it."""
    if not (isinstance(cfg.steps, int) and cfg.steps >= 1):
        raise ConfigError(f"{key}.steps", cfg.steps, "must be a positive integer")
    if cfg.n_batches is not None and not (isinstance(cfg.n_batches, int) and cfg.n_batches >= 1):
        raise ConfigError(f"{key}.n_batches", cfg.n_batches, "must be a positive integer or null (all batches)")
    for name in ("lr", "beta", "penalty_lr"):
        check_positive(f"{key}.{name}", getattr(cfg, name), "must be a finite number above 0")
    if not finite(cfg.log_alpha_init):
        raise ConfigError(f"{key}.log_alpha_init", cfg.log_alpha_init, "must be a finite number")
    if not 0 <= cfg.target_warmup <= 1:
        raise ConfigError(f"{key}.target_warmup", cfg.target_warmup, "must be in [0, 1]: a fraction of the steps")
    if not (finite(cfg.gamma) and cfg.gamma < 0):
        allowed = "must be a finite negative number: gates reach exactly 0 only if gamma < 0"
        raise ConfigError(f"{key}.gamma", cfg.gamma, allowed)
    if not (finite(cfg.zeta) and cfg.zeta > 1):
        allowed = "must be a finite number above 1: gates reach exactly 1 only if zeta > 1"
        raise ConfigError(f"{key}.zeta", cfg.zeta, allowed)
    if cfg.penalty is None and cfg.target_heads is None:
        raise ConfigError(f"{key}.penalty", None, f"set a fixed penalty weight or {key}.target_heads (heads to keep)")
    if cfg.penalty is not None and not (finite(cfg.penalty) and cfg.penalty >= 0):
        raise ConfigError(f"{key}.penalty", cfg.penalty, "must be a finite number, 0 or more, or null")
    targets = l0_targets(cfg)
    upper = n_heads if n_heads is not None else float("inf")
    if not targets or not all(t is None or (isinstance(t, int) and 0 <= t <= upper) for t in targets):
        allowed = "integers in 0.." + (f"{n_heads} (the model's heads)" if n_heads is not None else "n_heads")
        raise ConfigError(f"{key}.target_heads", cfg.target_heads, f"needs one of {allowed}, a list of them or null")


def validate_pruning_config(cfg: PruningConfig) -> None:
    if not cfg.orders:
        allowed = ", ".join(order.value for order in PruningOrder)
        raise ConfigError("ablation.pruning.orders", [], f"names no order: give at least one of {allowed}")
    if not 0 < cfg.step <= 1:
        raise ConfigError("ablation.pruning.step", cfg.step, "must be in (0, 1]: the fraction of heads per step")
    for order in cfg.orders:
        check_choice("ablation.pruning.orders", order, PruningOrder)
    if "random" in cfg.orders and cfg.random_seeds < 1:
        raise ConfigError("ablation.pruning.random_seeds", cfg.random_seeds, "must be a positive integer")
    if not (finite(cfg.tolerance) and cfg.tolerance >= 0):
        raise ConfigError("ablation.pruning.tolerance", cfg.tolerance, "must be a finite number, 0 or more")


DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def validate_ablation_config(cfg: AblationConfig) -> None:
    check_bools("ablation", cfg)
    check_bools("ablation.prune", cfg.prune)
    for name, scan in cfg.scans.items():
        if is_dataclass(scan):
            check_bools(f"ablation.scans.{name}", scan)
    check_choice("ablation.patch_direction", cfg.patch_direction, PatchDirection)
    check_choice("ablation.dtype", cfg.dtype, ScanDtype)
    check_seed("ablation.seed", cfg.seed)
    check_choice("ablation.patch_positions", cfg.patch_positions, PatchPositions)
    if cfg.n_eval is not None and cfg.n_eval < 1:
        raise ConfigError("ablation.n_eval", cfg.n_eval, "must be a positive integer or null (the whole split)")
    if cfg.n_reference < 1:
        raise ConfigError("ablation.n_reference", cfg.n_reference, "must be a positive integer")
    for key in ("batch_size", "masks_per_pass", "memory_budget_mb"):
        value = getattr(cfg, key)
        if value is not None and value < 1:
            raise ConfigError(
                f"ablation.{key}", value, "must be a positive integer" + ("" if key == "batch_size" else " or null")
            )
    validate_device(cfg.device)
    if cfg.prune.export:
        validate_pruning_config(cfg.pruning)
        validate_prune_export(cfg)


def validate_device(device: str) -> None:
    if not DEVICE.match(device):
        raise ConfigError("ablation.device", device, "allowed: auto, cpu, cuda, cuda:<index>")
    if device.startswith("cuda") and not cuda_available():
        raise ConfigError("ablation.device", device, "CUDA is not available on this machine; use auto or cpu")


def cuda_available() -> bool:
    import torch  # only for a config that asks for CUDA: the others are checked before torch loads (cli/)

    return torch.cuda.is_available()


def validate_prune_export(cfg: AblationConfig) -> None:
    prune = cfg.prune
    check_choice("ablation.prune.order", prune.order, ExportOrder)
    if prune.order == "l0_gates" and prune.fraction is not None:
        raise ConfigError("ablation.prune.fraction", prune.fraction, "applies to pruning orders, not to order=l0_gates")
    if prune.order == "l0_gates" and prune.heads is None:
        validate_l0_export(cfg)
    if prune.fraction is not None and not 0 <= prune.fraction <= 1:
        raise ConfigError("ablation.prune.fraction", prune.fraction, "must be in [0, 1] or null")
    if prune.heads is not None and prune.fraction is not None:
        raise ConfigError(
            "ablation.prune.heads", prune.heads, "give either ablation.prune.heads or ablation.prune.fraction"
        )


def validate_l0_export(cfg: AblationConfig) -> None:
    """order=l0_gates exports one learned mask: it needs an l0_gates scan, and a choice among its targets."""
    scans = [scan for scan in cfg.scans.values() if scan.kind == "l0_gates"]  # typed: each has its kind's keys
    if len(scans) != 1:
        raise ConfigError(
            "ablation.prune.order", "l0_gates", f"needs exactly one l0_gates scan in ablation (found {len(scans)})"
        )
    targets = l0_targets(scans[0].l0)
    chosen = cfg.prune.l0_target_heads
    if chosen is None and len(targets) > 1:
        raise ConfigError(
            "ablation.prune.l0_target_heads", None, f"the l0_gates scan has several targets, pick one of {targets}"
        )
    if chosen is not None and chosen not in targets:
        raise ConfigError("ablation.prune.l0_target_heads", chosen, f"must be one of the scan's targets {targets}")


def unselected_scans_dropped(cfg: DictConfig) -> list[str]:
    """Drop, in place, the ablation.scans entries of a composed config that no option of the ablation list selected
    (no `kind`: settings an experiment gives a scan that the command line's `ablation=[...]` left out); returns their
    names."""
    scans = cfg.ablation.scans
    dropped = [name for name, scan in scans.items() if scan.get("kind") is None]
    with open_dict(scans):  # a composed config is in struct mode, which refuses deletions
        for name in dropped:
            del scans[name]
    return dropped

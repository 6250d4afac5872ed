"""The ablation section of the train and ablate configs."""

from dataclasses import dataclass, field

from headcount.ablation.l0_gates import L0GatesConfig

MODES = ("zero", "mean", "resample")
SCAN_KINDS = (
    "baseline",
    "single_head",
    "layer",
    "leave_one_in",
    "pairs",
    "custom",
    "importance",
    "pruning",
    "l0_gates",
    "head_scores",
)
PRUNING_ORDERS = ("gradient", "gradient_iterative", "single_head", "random")
EXPORT_ORDERS = (*PRUNING_ORDERS, "l0_gates")  # what ablation.prune.order may name


@dataclass
class ScanConfig:
    kind: str = "single_head"  # one of SCAN_KINDS
    top_k: int | None = None  # pairs: only pairs among the k most important heads (None: all pairs)
    masks_file: str | None = None  # custom: YAML/JSON list of masks
    l0: L0GatesConfig = field(default_factory=L0GatesConfig)  # l0_gates: the hard-concrete gate training


@dataclass
class PruningConfig:
    step: float = 0.1  # fraction of all heads removed per step
    orders: list[str] = field(default_factory=lambda: list(PRUNING_ORDERS))
    random_seeds: int = 3
    tolerance: float = 0.01  # prunable = loss within (1 + tolerance) * baseline loss


@dataclass
class PruneExportConfig:
    export: bool = False  # write ablation/pruned.ckpt, a smaller model with the heads removed
    # Remove the largest prunable fraction found by this pruning order, or with `l0_gates` the heads the l0_gates
    # scan's learned gates close...
    order: str = "gradient"
    fraction: float | None = None  # ...or exactly this fraction in that pruning order...
    heads: list[list[int]] | None = None  # ...or exactly these [layer, head] pairs
    l0_target_heads: int | None = None  # order=l0_gates with several targets: the run whose mask to export


@dataclass
class AblationConfig:
    mode: str = "zero"  # one of MODES
    mean_per_position: bool = False  # mean: average z per position instead of over positions too
    split: str = "val"  # the split every mask is evaluated on
    reference_split: str = "train"  # where mean and resample replacements come from
    n_eval: int | None = None  # examples of `split` to evaluate on (None: all)
    n_reference: int = 512  # examples of `reference_split` for the means
    batch_size: int = 64  # examples per forward pass (times masks per pass)
    masks_per_pass: int | None = None  # None: as many as fit the memory budget
    memory_budget_mb: int | None = None  # activations per pass (None: 64 MiB on CPU, half the free CUDA memory)
    device: str = "auto"  # auto | cpu | cuda
    seed: int = 0  # resample pairing and random pruning orders
    normalize_importance: bool = True  # per-layer l2 normalisation of gradient importance (Michel et al.)
    progress: bool = True
    # Scans to run, keyed by name; filled by selecting configs from conf/ablation/.
    scans: dict[str, ScanConfig] = field(default_factory=dict)
    pruning: PruningConfig = field(default_factory=PruningConfig)
    prune: PruneExportConfig = field(default_factory=PruneExportConfig)

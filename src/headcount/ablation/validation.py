"""Checks on the ablation section that need no model or data, so bad input fails before any work starts."""

import re

import torch

from headcount.ablation.config import EXPORT_ORDERS, MODES, SCAN_KINDS, AblationConfig
from headcount.errors import ConfigError

SCAN_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")  # scan names become file names
DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def validate_ablation_config(cfg: AblationConfig) -> None:
    if cfg.mode not in MODES:
        raise ConfigError("ablation.mode", cfg.mode, f"allowed: {', '.join(MODES)}")
    if cfg.n_eval is not None and cfg.n_eval < 1:
        raise ConfigError("ablation.n_eval", cfg.n_eval, "must be a positive integer or null (the whole split)")
    if cfg.mode != "zero" and cfg.n_reference < 1:
        raise ConfigError(
            "ablation.n_reference", cfg.n_reference, f"mode={cfg.mode} needs reference examples: a positive integer"
        )
    for key in ("batch_size", "masks_per_pass", "memory_budget_mb"):
        value = getattr(cfg, key)
        if value is not None and value < 1:
            raise ConfigError(
                f"ablation.{key}", value, "must be a positive integer" + ("" if key == "batch_size" else " or null")
            )
    validate_device(cfg.device)
    for name, scan in cfg.scans.items():
        if not SCAN_NAME.match(name):
            raise ConfigError(f"ablation.scans.{name}", name, "scan names may use letters, digits, '_', '.' and '-'")
        if scan.kind not in SCAN_KINDS:
            raise ConfigError(f"ablation.scans.{name}.kind", scan.kind, f"allowed: {', '.join(SCAN_KINDS)}")
        if scan.kind == "custom" and not scan.masks_file:
            raise ConfigError(
                f"ablation.scans.{name}.masks_file", scan.masks_file, "a custom scan needs a YAML/JSON file of masks"
            )
        if scan.top_k is not None and scan.top_k < 2:
            raise ConfigError(
                f"ablation.scans.{name}.top_k", scan.top_k, "must be at least 2 (pairs among the top k heads) or null"
            )
    if cfg.prune.export or any(scan.kind == "pruning" for scan in cfg.scans.values()):
        from headcount.ablation.pruning import validate_pruning_config

        validate_pruning_config(cfg.pruning)
    if cfg.prune.export:
        validate_prune_export(cfg)


def validate_device(device: str) -> None:
    if not DEVICE.match(device):
        raise ConfigError("ablation.device", device, "allowed: auto, cpu, cuda, cuda:<index>")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("ablation.device", device, "CUDA is not available on this machine; use auto or cpu")


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def validate_prune_export(cfg: AblationConfig) -> None:
    prune = cfg.prune
    if cfg.mode == "resample" or (cfg.mode == "mean" and cfg.mean_per_position):
        raise ConfigError(
            "ablation.prune.export",
            True,
            "a smaller model can fold only zero or position-averaged mean ablation; "
            f"mode={cfg.mode}{' with mean_per_position' if cfg.mean_per_position else ''} varies with the input",
        )
    if prune.order not in EXPORT_ORDERS:
        raise ConfigError("ablation.prune.order", prune.order, f"allowed: {', '.join(EXPORT_ORDERS)}")
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
    from headcount.ablation.l0_gates import l0_targets

    scans = [scan for scan in cfg.scans.values() if scan.kind == "l0_gates"]
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

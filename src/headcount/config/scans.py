"""Each scan kind's settings: the keys the kind takes, as a typed dataclass named after it (the kind's module in
ablation/scans/ names it as its `Settings`; tests/test_scan_settings.py checks the two agree). They live here, with the
other schemas Hydra composes, because a config is composed and checked before torch loads (cli/): Hydra types every
scan entry of conf/ablation/<kind>.yaml by `scan_settings/<kind>` (its defaults list names it first), so a key the
kind does not take is refused at compose time, in one line.
"""

from dataclasses import dataclass, field, fields
from typing import Any

from hydra.core.config_store import ConfigStore

from headcount.config.ablation import L0GatesConfig
from headcount.errors import ConfigError, check_positive, check_seed, closest, finite
from headcount.registry import indexed_kinds

SETTINGS_GROUP = "scan_settings"  # the ConfigStore group of the kinds' settings schemas


@dataclass
class ScanSettings:
    """A scan's settings: its kind (set by the option of the ablation list that selects it, conf/ablation/<kind>.yaml).
    A kind that takes settings of its own subclasses this here, is listed in SETTINGS, and its Scan names the class as
    its `Settings`; a key the class lacks is refused (ablation/scans/base.py typed_scan, not_taken below)."""

    kind: str | None = None


@dataclass
class AttributionSettings(ScanSettings):
    verify_top_k: int = 10  # evaluate exactly the k heads (or head-positions) with the largest estimate


@dataclass
class CustomSettings(ScanSettings):
    masks_file: str | None = None  # a YAML/JSON list of masks


@dataclass
class DirectEffectSettings(ScanSettings):
    backup_top_k: int = 0  # mean-ablate the k heads of largest direct effect, then measure again


@dataclass
class EdgePruningSettings:
    """Edge pruning (Bhaskar et al. 2024): a hard-concrete mask per edge trained on the frozen model to a target
    sparsity (ablation/methods/edge_pruning.py)."""

    steps: int = 200  # optimiser steps (Lightning), cycling through the examples' batches
    lr: float = 0.1  # Adam on log_alpha
    batch_size: int | None = None  # examples per step (null: as many as ablation.memory_budget_mb fits)
    target_sparsity: float = 0.9  # the share of edges removed that the Lagrangian steers to
    target_warmup: float = 0.5  # share of the steps over which the target rises linearly from 0 to target_sparsity
    penalty_lr: float = 1.0  # dual ascent on the Lagrange multipliers per unit of density violation
    objective: str = "kl"  # kl: KL(full model || circuit) at the score points (the paper's); metric: squared error
    beta: float = 2 / 3  # hard-concrete temperature
    gamma: float = -0.1  # lower stretch limit, < 0
    zeta: float = 1.1  # upper stretch limit, > 1
    log_alpha_init: float = 3.0  # every mask starts open
    warm_start: bool = False  # start log_alpha from EAP-IG's ranking: log_alpha_init + warm_scale (2 rank - 1)
    warm_scale: float = 3.0
    seed: int = 0  # the hard-concrete noise


EDGE_METHODS = ("edge_pruning", "ensemble")  # edge_attribution's methods beyond EAP, EAP-IG and exact
OBJECTIVES = ("kl", "metric")


def check_edge_pruning(cfg: EdgePruningSettings, key: str) -> None:
    """One-line ConfigErrors for edge pruning settings training cannot use."""
    if not (isinstance(cfg.steps, int) and not isinstance(cfg.steps, bool) and cfg.steps >= 1):
        raise ConfigError(f"{key}.steps", cfg.steps, "must be a positive integer")
    if cfg.batch_size is not None and not (isinstance(cfg.batch_size, int) and cfg.batch_size >= 1):
        raise ConfigError(f"{key}.batch_size", cfg.batch_size, "must be a positive integer or null (as many as fit)")
    for name in ("lr", "beta", "penalty_lr", "warm_scale"):
        check_positive(f"{key}.{name}", getattr(cfg, name))
    if not (finite(cfg.target_sparsity) and 0 <= cfg.target_sparsity < 1):
        allowed = "must be in [0, 1): the share of edges removed (1 would remove every edge)"
        raise ConfigError(f"{key}.target_sparsity", cfg.target_sparsity, allowed)
    if not (finite(cfg.target_warmup) and 0 <= cfg.target_warmup <= 1):
        raise ConfigError(f"{key}.target_warmup", cfg.target_warmup, "must be in [0, 1]: a share of the steps")
    if cfg.objective not in OBJECTIVES:
        raise ConfigError(f"{key}.objective", cfg.objective, f"must be one of {', '.join(OBJECTIVES)}")
    if not (finite(cfg.gamma) and cfg.gamma < 0):
        raise ConfigError(
            f"{key}.gamma", cfg.gamma, "must be a finite negative number: masks reach 0 only if gamma < 0"
        )
    if not (finite(cfg.zeta) and cfg.zeta > 1):
        raise ConfigError(f"{key}.zeta", cfg.zeta, "must be a finite number above 1: masks reach 1 only if zeta > 1")
    if not finite(cfg.log_alpha_init):
        raise ConfigError(f"{key}.log_alpha_init", cfg.log_alpha_init, "must be a finite number")
    if not isinstance(cfg.warm_start, bool):
        raise ConfigError(f"{key}.warm_start", cfg.warm_start, "must be true or false")
    check_seed(f"{key}.seed", cfg.seed)


def check_edge_methods(methods: list[str], key: str) -> None:
    """The methods an edge_attribution scan adds to EAP, EAP-IG and exact: each known, none twice, and the ensemble
    only beside the edge pruning it averages."""
    for method in methods:
        if method not in EDGE_METHODS:
            allowed = f"methods beyond eap, eap_ig and exact (always computed) are {', '.join(EDGE_METHODS)}"
            raise ConfigError(key, method, allowed)
    if len(set(methods)) != len(methods):
        raise ConfigError(key, list(methods), "lists a method twice")
    if "ensemble" in methods and "edge_pruning" not in methods:
        raise ConfigError(key, list(methods), "ensemble averages eap, eap_ig and edge_pruning: add edge_pruning")


@dataclass
class EdgeAttributionSettings(ScanSettings):
    steps: int = 5  # EAP-IG's interpolation steps
    verify_top_k: int = 10  # the k largest EAP estimates scored exactly
    exact_all: bool = False  # every edge's exact score, not only the verify_top_k largest EAP's
    circuit_size: int = 20  # the edges of the circuit drawn and scored
    circuit_sizes: list[int] | None = None  # the faithfulness curve's sizes (None: 1, 2, 4, ...)
    random_sets: int = 5  # random edge sets of each size beside the curve
    receivers: list[str] = field(default_factory=list)  # only the edges into these receiver inputs (none: all)
    methods: list[str] = field(default_factory=list)  # beyond eap, eap_ig, exact: edge_pruning, ensemble
    edge_pruning: EdgePruningSettings = field(default_factory=EdgePruningSettings)  # its training, when listed


@dataclass
class HeadCircuitSettings(ScanSettings):
    heads: list[str] = field(default_factory=list)  # the circuit's heads (names, layers, top-k)
    random_sets: int = 5  # random circuits of as many heads beside it


@dataclass
class L0GatesSettings(ScanSettings):
    l0: L0GatesConfig = field(default_factory=L0GatesConfig)  # the hard-concrete gate training


@dataclass
class PairsSettings(ScanSettings):
    top_k: int | None = None  # only pairs among the k most important heads (None: all pairs)


@dataclass
class PathPatchingSettings(ScanSettings):
    # the senders (node names: emb, L0H1, L0.mlp; L2 for every head of layer 2; top3:direct_effect for another scan
    # kind's 3 highest-ranked heads) and the receiver inputs (L1H0.k, L1.mlp, logits; L1.q for the queries of every
    # head of layer 1; top3:direct_effect.q)
    senders: list[str] = field(default_factory=list)
    receivers: list[str] = field(default_factory=list)
    receivers_together: bool = True  # one path per sender into the whole receiver set, or each receiver alone
    # leave out each sender's receivers that do not read it (its own layer or earlier) rather than refuse them, and
    # a sender none of them reads (senders [heads] into heads found by another scan)
    skip_unreached: bool = False


@dataclass
class PositionAttentionSettings(ScanSettings):
    from_position: str | None = None  # attend from this named position (S2), not the scored one


@dataclass
class TopHeadsSettings(ScanSettings):
    top_fraction: float = 0.05  # this share of all heads, the highest ranked, off together...
    rank_by: str = "single_head"  # ...ranked by this scan kind's per-head result (single_head, direct_effect, ...)
    random_sets: int = 5  # ...beside this many random sets of as many heads


SETTINGS: dict[str, type[ScanSettings]] = {
    "attribution": AttributionSettings,
    "custom": CustomSettings,
    "direct_effect": DirectEffectSettings,
    "edge_attribution": EdgeAttributionSettings,
    "head_circuit": HeadCircuitSettings,
    "l0_gates": L0GatesSettings,
    "pairs": PairsSettings,
    "path_patching": PathPatchingSettings,
    "position_attention": PositionAttentionSettings,
    "top_heads": TopHeadsSettings,
}  # a kind not listed takes no key but its kind


def register_scan_settings(store: ConfigStore) -> None:
    """Each scan kind's settings as `scan_settings/<kind>`, the kinds read from the component index (no torch)."""
    for kind in indexed_kinds()["scan kind"].names():
        store.store(group=SETTINGS_GROUP, name=kind, node=SETTINGS.get(kind, ScanSettings)(kind=kind))


def takes(kind: str) -> str:
    """What a kind's settings are, in words: `steps, verify_top_k, ...` or `none but its kind`."""
    names = [f.name for f in fields(SETTINGS.get(kind, ScanSettings)) if f.name != "kind"]
    return ", ".join(names) if names else "none but its kind"


def not_taken(name: str, kind: str, key: str, value: Any) -> ConfigError:
    """The one line for a setting scan `name`'s kind does not take: the kind, and what it takes."""
    names = [f.name for f in fields(SETTINGS.get(kind, ScanSettings)) if f.name != "kind"]
    allowed = f"not a setting of scan kind {kind}, which takes {takes(kind)}"
    if (match := closest(key, names)) is not None:
        allowed += f"; did you mean ablation.scans.{name}.{match}?"
    return ConfigError(f"ablation.scans.{name}.{key}", value, allowed)

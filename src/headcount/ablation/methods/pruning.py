"""Masked pruning curves: remove heads in a chosen order, a fraction of all heads at a time, and record the loss.

Orders (Michel et al. 2019 and baselines): `gradient` ranks heads once by gradient importance at the full model
(averaged over batches); `gradient_per_example` the same with the paper's own definition, averaged over examples;
`gradient_iterative` re-ranks the surviving heads under the current mask after every step; `single_head` removes first
the heads whose removal alone raised the loss least; `random` draws `random_seeds` permutations. Every mask is known
before any loss is, so all masks of all orders go to the evaluator in one call, each distinct mask once.
Masks are (L, H) keep-gates: 1 keeps a head, 0 removes it; heads a pruned layer lacks stay 1 and are never counted.

Ranked orders break ties in their score by the raw gradient importance (importance.py), then by the head's index. An
order whose heads all score the same is arbitrary (index order): it is logged as a warning and its rows carry
`arbitrary_order`, so that nobody reads its prunable fraction as a finding.
"""

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import pandas as pd
import torch
from torch import Tensor

from headcount.ablation.engine.heads import existing_heads
from headcount.ablation.engine.metrics import Loss, Metric
from headcount.ablation.methods.importance import Importance
from headcount.config.ablation import PruningConfig, validate_pruning_config
from headcount.errors import ConfigError
from headcount.registry import Registry

log = logging.getLogger(__name__)

CURVE_COLUMNS = ["order", "seed", "fraction", "n_pruned", "loss", "acc", "delta_loss", "arbitrary_order"]  # loss
Scores = Importance | Tensor  # what an importance function returns; a plain (L, H) tensor breaks no ties


def pruning_curves(
    evaluate: Callable[[Tensor], dict],
    importance_fn: Callable[[Tensor], Scores],
    single_head_delta: Tensor | None,
    n_heads_per_layer: list[int],
    cfg: PruningConfig,
    seed: int,
    baseline: dict,
    metric: Metric | None = None,
) -> pd.DataFrame:
    """One row per (order, seed, fraction) for fractions 0, step, 2*step, ..., 1.0 of all existing heads, with
    n_pruned = round(fraction * total). `evaluate(masks_MLH) -> {column: (M,)}` for the metric's columns (default
    loss: loss and acc); `importance_fn(mask_LH) -> Importance` or an (L, H) tensor; `single_head_delta` (L, H) how
    much each head removed alone worsens the metric (None skips that order); `baseline`: the unmasked model's
    metric columns. The seed column is `seed` for the deterministic orders and, for random, the seed of that
    permutation (derived from `seed`: the same seed gives the same curves); arbitrary_order marks the orders whose
    heads all scored the same."""
    metric = metric or Loss()
    columns = ["order", "seed", "fraction", "n_pruned", *metric.columns, f"delta_{metric.primary}", "arbitrary_order"]
    validate_pruning_config(cfg)
    exists_LH = existing_heads(n_heads_per_layer)
    fractions = step_fractions(cfg.step)
    n_pruned = [round(f * int(exists_LH.sum())) for f in fractions]
    curves: list[tuple[str, int, Tensor]] = []  # (order, seed, masks (F, L, H), one per fraction)
    arbitrary: set[str] = set()
    ranking = Ranking(importance_fn, single_head_delta, exists_LH, cfg, seed)
    for order in cfg.orders:
        kind = PRUNING_ORDERS.get(str(order), "ablation.pruning.orders")()
        drawn, is_arbitrary_order = kind.curves(ranking, n_pruned)
        curves += [(str(order), order_seed, masks) for order_seed, masks in drawn]
        arbitrary |= {str(order)} if is_arbitrary_order else set()
    if not curves:
        return pd.DataFrame(columns=columns)
    # Fraction 0 and 1.0 give the same mask in every order, and small models repeat counts: evaluate each mask once.
    unique_MLH, index_N = torch.unique(torch.cat([masks for *_, masks in curves]), dim=0, return_inverse=True)
    results = evaluate(unique_MLH)
    rows = [
        (order, order_seed, fraction, count)
        for order, order_seed, _ in curves
        for fraction, count in zip(fractions, n_pruned)
    ]
    table = pd.DataFrame(rows, columns=columns[:4])
    for column in metric.columns:
        table[column] = results[column].detach().double().cpu()[index_N].numpy()
    table[f"delta_{metric.primary}"] = table[metric.primary] - float(baseline[metric.primary])
    table["arbitrary_order"] = table["order"].isin(arbitrary)
    return table


@dataclass
class Ranking:
    """What a pruning order ranks heads by: gradient importance at a mask (`importance_fn`), each head's single-head
    damage (`single_head_delta`: an (L, H) tensor, a function giving one, or None when there is none), the head slots
    that exist, the pruning settings and the run's seed."""

    importance_fn: Callable[..., Scores]
    single_head_delta: Tensor | Callable[[], Tensor] | None
    exists_LH: Tensor
    cfg: PruningConfig
    seed: int

    def single_head(self) -> Tensor | None:
        delta = self.single_head_delta
        return delta() if callable(delta) else delta


PRUNING_ORDERS: Registry[type["PruningOrder"]] = Registry(
    "pruning order", "ablation.pruning.orders", "the order a pruning curve removes heads in"
)


class PruningOrder:
    """How heads are ranked for removal: `curves` gives the masks of a pruning curve at each count of heads removed
    (one curve, or one per seed) and whether the ranking was arbitrary; `mask_at` the keep-gates at one count, as the
    curve has them (what a structural export at that fraction removes)."""

    name: ClassVar[str]
    follows_gradient: ClassVar[bool] = False  # ranks by the metric's gradient (the metric must have one)

    def ranking(self, r: Ranking) -> tuple[Tensor, Scores | None]:
        """(L, H) removal ranking, and the scores it came from (None: no scores to call arbitrary)."""
        raise NotImplementedError

    def curves(self, r: Ranking, n_pruned: list[int]) -> tuple[list[tuple[int, Tensor]], bool]:
        ranking, scores = self.ranking(r)
        arbitrary = scores is not None and warn_if_arbitrary(self.name, as_importance(scores), r.exists_LH)
        return [(r.seed, masks_removing_first(ranking, n_pruned, r.exists_LH))], arbitrary

    def mask_at(self, r: Ranking, n_pruned: int) -> Tensor:
        return masks_removing_first(self.ranking(r)[0], [n_pruned], r.exists_LH)[0]


@PRUNING_ORDERS.register
class Gradient(PruningOrder):
    """once by gradient importance at the full model, averaged over batches"""

    name, follows_gradient = "gradient", True
    per_example: ClassVar[dict] = {}

    def ranking(self, r: Ranking) -> tuple[Tensor, Scores]:
        scores = as_importance(r.importance_fn(torch.ones(r.exists_LH.shape), **self.per_example))
        return rank_ascending(scores.score_LH, r.exists_LH, scores.raw_LH), scores


@PRUNING_ORDERS.register
class GradientPerExample(Gradient):
    """the same with Michel et al.'s own definition: the expectation over examples"""

    name, per_example = "gradient_per_example", {"per_example": True}


@PRUNING_ORDERS.register
class GradientIterative(PruningOrder):
    """re-ranks the surviving heads by gradient importance under the current mask after every step"""

    name, follows_gradient = "gradient_iterative", True

    def curves(self, r: Ranking, n_pruned: list[int]) -> tuple[list[tuple[int, Tensor]], bool]:
        remembering = FirstScores(r.importance_fn)
        masks = iterative_masks(remembering, n_pruned, r.exists_LH)
        first = remembering.first
        return [(r.seed, masks)], first is not None and warn_if_arbitrary(self.name, first, r.exists_LH)

    def mask_at(self, r: Ranking, n_pruned: int) -> Tensor:
        # The same steps as the curve up to this count, so the mask matches the curve's at a grid fraction.
        total = int(r.exists_LH.sum())
        steps = {count for count in (round(f * total) for f in step_fractions(r.cfg.step)) if count < n_pruned}
        return iterative_masks(r.importance_fn, sorted(steps | {n_pruned}), r.exists_LH)[-1]


@PRUNING_ORDERS.register
class SingleHead(PruningOrder):
    """first the heads whose removal alone raised the metric least (the single_head scan's deltas)"""

    name = "single_head"

    def ranking(self, r: Ranking) -> tuple[Tensor, Scores]:
        delta_LH = r.single_head()
        if tuple(delta_LH.shape) != tuple(r.exists_LH.shape):
            raise ValueError(f"single_head_delta has shape {tuple(delta_LH.shape)}, not (L, H)")
        return rank_ascending(as_importance(delta_LH).score_LH, r.exists_LH), delta_LH

    def curves(self, r: Ranking, n_pruned: list[int]) -> tuple[list[tuple[int, Tensor]], bool]:
        if r.single_head() is None:
            log.warning("pruning order single_head skipped: it needs the single-head scan's loss deltas")
            return [], False
        return super().curves(r, n_pruned)


@PRUNING_ORDERS.register
class Random(PruningOrder):
    """random_seeds random permutations"""

    name = "random"

    def curves(self, r: Ranking, n_pruned: list[int]) -> tuple[list[tuple[int, Tensor]], bool]:
        drawn = []
        for replicate in range(r.cfg.random_seeds):
            random_seed = r.seed * r.cfg.random_seeds + replicate  # distinct across replicates and across run seeds
            ranking = random_ranking(r.exists_LH, random_seed)
            drawn.append((random_seed, masks_removing_first(ranking, n_pruned, r.exists_LH)))
        return drawn, False

    def ranking(self, r: Ranking) -> tuple[Tensor, None]:
        return random_ranking(r.exists_LH, r.seed * r.cfg.random_seeds), None  # the first of its seeds


def as_importance(scores: Scores) -> Importance:
    return scores if isinstance(scores, Importance) else Importance(scores, scores)


class FirstScores:
    """An importance function that keeps the scores of its first call: for an iterative order, the full model's."""

    def __init__(self, importance_fn: Callable[[Tensor], Scores]):
        self.importance_fn, self.first = importance_fn, None

    def __call__(self, mask_LH: Tensor) -> Importance:
        scores = as_importance(self.importance_fn(mask_LH))
        self.first = scores if self.first is None else self.first
        return scores


def is_arbitrary(scores: Importance, candidates_LH: Tensor) -> bool:
    """True when an order ranks two or more heads that all have the same score and the same raw score."""
    score, raw = (t.detach().cpu().flatten()[candidates_LH.flatten()] for t in scores)
    return len(score) > 1 and bool((score == score[0]).all() and (raw == raw[0]).all())


def warn_if_arbitrary(order: str, scores: Importance, candidates_LH: Tensor) -> bool:
    if not is_arbitrary(scores, candidates_LH):
        return False
    value = float(scores.score_LH.detach().cpu().flatten()[candidates_LH.flatten()][0])
    log.warning(
        "pruning order %s is arbitrary: every head scores the same (%.4g), so heads go in index order and its "
        "prunable fraction says nothing about the heads",
        order,
        value,
    )
    return True


def prunable_fractions(
    curves: pd.DataFrame, baseline_loss: float, tolerance: float, metric: Metric | None = None
) -> dict[str, float]:
    """Per order, the largest fraction f such that the metric (for random: its mean over seeds) stays within
    tolerance of the baseline, relative to it, at every fraction up to and including f: for loss, within
    baseline_loss * (1 + tolerance); for a metric where higher is better, at least baseline - tolerance * |baseline|.

    This is the conservative, monotone reading: a curve that leaves the tolerance band and later dips back into it
    does not count past its first exit: a lucky dip after a bad step is noise, not a safe amount of pruning.
    An order whose loss already exceeds the band at fraction 0 gets 0.0 (nothing removed is the only safe choice).
    The fraction reported is the share of heads that step really removed (n_pruned / all heads), not its nominal
    fraction: with few heads, a 10% step rounds to zero heads, and "0.2 prunable" must not mean "none removed"."""
    if not tolerance >= 0:
        raise ConfigError("ablation.pruning.tolerance", tolerance, "must be a non-negative number")
    metric = metric or Loss()
    # baseline * (1 + tolerance) for a positive loss, as a product: a sum would round 1.01 past 1.0 + 0.01
    worse_side = 1 - tolerance if metric.higher_is_better == (baseline_loss >= 0) else 1 + tolerance
    threshold = baseline_loss * worse_side
    prunable = {}
    for order, curve in curves.groupby("order", sort=False):
        value = metric.primary
        steps = curve.groupby("fraction").agg(value=(value, "mean"), n_pruned=("n_pruned", "first")).sort_index()
        within = (metric.damage(steps["value"], threshold) <= 0).to_numpy()
        n_within = len(within) if within.all() else int(within.argmin())  # steps before the first exit
        n_heads = steps["n_pruned"].max()
        prunable[order] = float(steps["n_pruned"].iloc[n_within - 1] / n_heads) if n_within and n_heads else 0.0
    return prunable


def step_fractions(step: float) -> list[float]:
    """0, step, 2*step, ... and always 1.0, rounded so that 0.1 * 3 prints as 0.3."""
    n_steps = math.ceil(1 / step - 1e-9)
    return [round(min(k * step, 1.0), 12) for k in range(n_steps + 1)]


def rank_ascending(score_LH: Tensor, candidates_LH: Tensor, tiebreak_LH: Tensor | None = None) -> Tensor:
    """Flat indices of the candidate heads, lowest score first; ties go to the lower tiebreak score, then to the lower
    index (deterministic)."""
    candidates = candidates_LH.flatten().nonzero().squeeze(1)
    if tiebreak_LH is not None:  # sort by the tie-break first: the stable sort by score keeps its order within ties
        candidates = candidates[torch.sort(tiebreak_LH.detach().cpu().flatten()[candidates], stable=True).indices]
    order = torch.sort(score_LH.detach().cpu().flatten()[candidates], stable=True).indices
    return candidates[order]


def random_ranking(exists_LH: Tensor, seed: int) -> Tensor:
    candidates = exists_LH.flatten().nonzero().squeeze(1)
    return candidates[torch.randperm(len(candidates), generator=torch.Generator().manual_seed(seed))]


def masks_removing_first(ranking: Tensor, n_pruned: list[int], exists_LH: Tensor) -> Tensor:
    """(F, L, H): mask f removes the first n_pruned[f] heads of the ranking."""
    masks_FLH = torch.ones(len(n_pruned), *exists_LH.shape)
    for mask_LH, count in zip(masks_FLH, n_pruned):
        mask_LH.view(-1)[ranking[:count]] = 0
    return masks_FLH


def iterative_masks(importance_fn: Callable[[Tensor], Scores], n_pruned: list[int], exists_LH: Tensor) -> Tensor:
    """(F, L, H): before each step, rank the surviving heads by importance under the current mask (Michel et al.)."""
    mask_LH = torch.ones(exists_LH.shape)
    masks = []
    for count in n_pruned:
        surviving_LH = exists_LH & (mask_LH == 1)
        n_removed = int((exists_LH & (mask_LH == 0)).sum())
        if count > n_removed:
            # Removing every survivor needs no ranking; skip the gradient pass.
            if count < int(exists_LH.sum()):
                scores = as_importance(importance_fn(mask_LH.clone()))
                ranking = rank_ascending(scores.score_LH, surviving_LH, scores.raw_LH)
            else:
                ranking = surviving_LH.flatten().nonzero().squeeze(1)
            mask_LH.view(-1)[ranking[: count - n_removed]] = 0
        masks.append(mask_LH.clone())
    return torch.stack(masks)

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

import pandas as pd
import torch
from torch import Tensor

from headcount.ablation.engine.metrics import Loss, Metric
from headcount.ablation.methods.importance import Importance
from headcount.config.ablation import PruningConfig, validate_pruning_config
from headcount.errors import ConfigError

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
    for order in cfg.orders:
        if order in ("gradient", "gradient_per_example"):
            per_example = {"per_example": True} if order == "gradient_per_example" else {}
            scores = as_importance(importance_fn(torch.ones(exists_LH.shape), **per_example))
            arbitrary |= {order} if warn_if_arbitrary(order, scores, exists_LH) else set()
            ranking = rank_ascending(scores.score_LH, exists_LH, scores.raw_LH)
            curves.append((order, seed, masks_removing_first(ranking, n_pruned, exists_LH)))
        elif order == "gradient_iterative":
            remembering = FirstScores(importance_fn)
            curves.append((order, seed, iterative_masks(remembering, n_pruned, exists_LH)))
            first = remembering.first
            arbitrary |= {order} if first is not None and warn_if_arbitrary(order, first, exists_LH) else set()
        elif order == "single_head" and single_head_delta is None:
            log.warning("pruning order single_head skipped: it needs the single-head scan's loss deltas")
        elif order == "single_head":
            if tuple(single_head_delta.shape) != tuple(exists_LH.shape):
                raise ValueError(f"single_head_delta has shape {tuple(single_head_delta.shape)}, not (L, H)")
            scores = as_importance(single_head_delta)
            arbitrary |= {order} if warn_if_arbitrary(order, scores, exists_LH) else set()
            ranking = rank_ascending(scores.score_LH, exists_LH)
            curves.append((order, seed, masks_removing_first(ranking, n_pruned, exists_LH)))
        else:
            for replicate in range(cfg.random_seeds):
                random_seed = seed * cfg.random_seeds + replicate  # distinct across replicates and across run seeds
                ranking = random_ranking(exists_LH, random_seed)
                curves.append((order, random_seed, masks_removing_first(ranking, n_pruned, exists_LH)))
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


def existing_heads(n_heads_per_layer: list[int]) -> Tensor:
    """(L, H) bool: which head slots exist; a pruned layer has fewer heads than the largest one."""
    H = max(max(n_heads_per_layer), 1)
    return torch.arange(H) < torch.tensor(n_heads_per_layer).unsqueeze(1)


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

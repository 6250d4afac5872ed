"""Uncertainty of scores over prompts: the bootstrap (Efron 1979) of any score that is a sum over prompts divided by
their number of score points, and how stable a top-n set (a circuit's edges, "the few heads") is across resamples.

A table's score is S = sum_p c_p / sum_p n_p, c_p prompt p's contribution (its points' metric values summed; an
edge's exact effect, its EAP or EAP-IG dot products, a head's damage) and n_p its score points. A resample draws P
prompts with replacement (prompt p drawn k_rp times, seeded: `resample_counts`) and recomputes S_r = sum_p k_rp c_p /
sum_p k_rp n_p, so a prompt's points stay together (prompts, not points, are the sampled units). The percentile
interval at level L is the (1 - L)/2 and (1 + L)/2 quantiles of the S_r (linear interpolation between order
statistics, torch.quantile). Stability: for each resample the top n items by |S_r| against the full data's top n,
their overlap |top_r & top| / n, its mean and lowest over the resamples, and each item's share of resamples in
which it is in the top n.
"""

import torch
from torch import Tensor

from headcount.errors import ConfigError

RESAMPLES, LEVEL = 1000, 0.95  # what every scan's intervals use: 1000 resamples, 95% percentile intervals


def resample_counts(n_prompts: int, resamples: int, seed: int = 0) -> Tensor:
    """(R, P) float64: how often each of P prompts is drawn in each of R resamples of P draws with replacement."""
    if n_prompts < 1 or resamples < 1:
        raise ConfigError("bootstrap.resamples", resamples, "needs >= 1 resample of >= 1 prompt")
    generator = torch.Generator().manual_seed(seed)
    drawn_RP = torch.randint(0, n_prompts, (resamples, n_prompts), generator=generator)
    counts = torch.zeros(resamples, n_prompts, dtype=torch.float64)
    return counts.scatter_add_(1, drawn_RP, torch.ones_like(drawn_RP, dtype=torch.float64))


def bootstrap_scores(contributions_PK: Tensor, points_P: Tensor, counts_RP: Tensor) -> Tensor:
    """(R, K): each resample's scores sum_p k_rp c_pk / sum_p k_rp n_p."""
    if contributions_PK.shape[0] != len(points_P) or counts_RP.shape[1] != len(points_P):
        shapes = f"contributions {tuple(contributions_PK.shape)}, points {len(points_P)}, "
        shapes += f"counts {tuple(counts_RP.shape)}"
        raise ConfigError("bootstrap", shapes, "one row of contributions and one count per prompt")
    counts = counts_RP.double()
    return (counts @ contributions_PK.double()) / (counts @ points_P.double())[:, None]


def resampled_score(contributions_P: Tensor, points_P: Tensor, counts_RP: Tensor) -> Tensor:
    """(R,): one score's value in each resample, sum_p k_rp c_p / sum_p k_rp n_p (a divisor for percentile_interval)."""
    return bootstrap_scores(contributions_P[:, None], points_P, counts_RP)[:, 0]


CHUNK = 2**22  # resampled scores held at once (float64: 32 MiB), whatever the number of items and resamples


def percentile_interval(
    contributions_PK: Tensor,
    points_P: Tensor,
    counts_RP: Tensor,
    level: float = 0.95,
    divisor_R: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """(low, high), each (K,): the resampled scores' (1 - level)/2 and (1 + level)/2 quantiles, items taken some at a
    time so that R resamples of K items never sit in memory at once. divisor_R: each resample's scores divided by
    it, for a ratio of two scores over the same resample (a share of a gap, a faithfulness: `resampled_score`);
    a resample whose divisor is 0 gives a NaN or infinite score, which the quantiles carry."""
    if not 0 < level < 1:
        raise ConfigError("bootstrap.level", level, "a confidence level strictly between 0 and 1, e.g. 0.95")
    tails = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    step = max(1, CHUNK // len(counts_RP))
    scale = 1.0 if divisor_R is None else divisor_R.double()[:, None]
    bounds = [
        torch.quantile(bootstrap_scores(contributions_PK[:, k : k + step], points_P, counts_RP) / scale, tails, dim=0)
        for k in range(0, contributions_PK.shape[1], step)
    ]
    both = torch.cat(bounds, dim=1) if bounds else torch.zeros(2, 0, dtype=torch.float64)
    return both[0], both[1]


def top_n_stability(
    contributions_PK: Tensor, points_P: Tensor, counts_RP: Tensor, n: int, magnitude: bool = True
) -> dict:
    """How stable the top n items by |score| (magnitude=False: by score, largest first: heads by damage) are across
    resamples: mean_overlap and min_overlap of each resample's top n with the full data's (share of n), and
    inclusion (K,), each item's share of resamples with it in the top n. Resamples are taken some at a time (CHUNK
    scores)."""
    K = contributions_PK.shape[1]
    if not 1 <= n <= K:
        raise ConfigError("bootstrap.top_n", n, f"must lie in 1..{K} (the items scored)")
    key = torch.abs if magnitude else (lambda scores: scores)
    full = in_top(key(contributions_PK.double().sum(0, keepdim=True) / points_P.double().sum()), n)[0]
    overlaps, inclusion = [], torch.zeros(K, dtype=torch.float64)
    step = max(1, CHUNK // K)
    for r in range(0, len(counts_RP), step):
        in_top_RK = in_top(key(bootstrap_scores(contributions_PK, points_P, counts_RP[r : r + step])), n)
        overlaps.append((in_top_RK & full).sum(1).double() / n)
        inclusion += in_top_RK.double().sum(0)
    overlap_R = torch.cat(overlaps)
    return {
        "mean_overlap": float(overlap_R.mean()),
        "min_overlap": float(overlap_R.min()),
        "inclusion": inclusion / len(counts_RP),
    }


def in_top(scores_RK: Tensor, n: int) -> Tensor:
    """(R, K) bool: each row's n largest scores, ties at the n-th largest taken lowest index first (the order of a
    stable sort). By the n-th largest value (topk) rather than a sort of every item: a resample of 123,211 edges
    needs no full sort to find its top 20."""
    nth_R1 = scores_RK.topk(n, dim=1).values[:, -1:]
    above_RK, tied_RK = scores_RK > nth_R1, scores_RK == nth_R1
    room_R1 = n - above_RK.sum(1, keepdim=True)
    return above_RK | (tied_RK & (tied_RK.cumsum(1) <= room_R1))


def top_n_overlap(first: list, second: list) -> float:
    """|first & second| / n of two top-n lists of names (two seeds' circuits): 1 the same set, 0 disjoint."""
    if len(first) != len(second) or not first:
        raise ConfigError("bootstrap.top_n", (len(first), len(second)), "two non-empty top-n lists of one length n")
    return len(set(first) & set(second)) / len(first)


def score_intervals(
    per_example: dict[str, Tensor], points_P: Tensor, counts_RP: Tensor, level: float = 0.95
) -> dict[str, tuple[Tensor, Tensor]]:
    """name -> (low, high): the percentile interval of each (P, K) per-prompt score (exact, EAP, EAP-IG
    contributions) under the same resamples, so that intervals of different methods are comparable."""
    return {name: percentile_interval(values, points_P, counts_RP, level) for name, values in per_example.items()}

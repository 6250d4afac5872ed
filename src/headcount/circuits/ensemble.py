"""An ensemble edge ranking: the mean of several methods' normalised scores (the 2025 MIB shared task's winner
averaged EAP, EAP-IG and warm-started edge pruning).

Each method's |score| is rank-normalised, r_e = rank(|s_e|) / E in (0, 1] (1: the largest; tied scores share their
average rank), and the ensemble score is the mean of r over the methods. Ranks, not z-scores: circuits keep the top
n by |score|, so only each method's order means anything across methods. Their scales do not compare (EAP and EAP-IG
are in the metric's unit and heavy-tailed, a few edges orders of magnitude above the rest; edge pruning's log_alpha
has no unit at all and any monotone map of it ranks the same), and a z-score would let the method with the most
extreme tail decide the ensemble's top edges alone, and change with a monotone rescaling of log_alpha that changes no
ranking. A rank is invariant to both.
"""

import pandas as pd
import torch
from torch import Tensor

from headcount.errors import ConfigError


def rank_normalise(scores_E: Tensor) -> Tensor:
    """(E,) float64: rank(|score|) / E, 1/E for the smallest |score| up to 1 for the largest, ties averaged."""
    if scores_E.ndim != 1 or not len(scores_E):
        raise ConfigError("circuits.scores", tuple(scores_E.shape), "needs one score per edge, at least one edge")
    if not bool(torch.isfinite(scores_E).all()):
        raise ConfigError("circuits.scores", "a score that is not finite", "every score must be finite to be ranked")
    ranks = pd.Series(scores_E.double().abs().cpu().numpy()).rank(method="average").to_numpy()
    return torch.tensor(ranks, dtype=torch.float64) / len(scores_E)


def ensemble_scores(scores: dict[str, Tensor]) -> Tensor:
    """(E,) float64: the mean over the methods (name -> (E,) scores) of rank_normalise(score)."""
    if not scores:
        raise ConfigError("circuits.ensemble", [], "needs at least one method's scores")
    shapes = {tuple(v.shape) for v in scores.values()}
    if len(shapes) != 1:
        raise ConfigError("circuits.ensemble", sorted(scores), f"the methods' scores differ in shape: {shapes}")
    return torch.stack([rank_normalise(v) for v in scores.values()]).mean(0)

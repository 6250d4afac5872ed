"""CPR and CMD: the circuit localization scores of the Mechanistic Interpretability Benchmark (MIB; Mueller et al.,
ICML 2025), as its evaluation code defines them.

A ranking of edges is turned into circuits of the top n edges by |score| (pruned to those on a path from the
embeddings to the logits, as faithfulness.top_edges does and MIB's `apply_topn(..., prune=True)` does) at ten sizes,
the fractions 0.1%, 0.2%, 0.5%, 1%, 2%, 5%, 10%, 20%, 50% and 100% of the model's edges, n = floor(fraction * edges)
(MIB's int(pct * n_edges); `mib_sizes` computes it in integers: per mille times edges, divided by 1000, the same
numbers without a float's rounding). At each size the circuit's faithfulness

    f(C) = (m(C) - m(empty)) / (m(full) - m(empty))

is measured by the edge-patched forward (faithfulness.py: m(full) the clean model, m(empty) every edge removed, both
measured in the same passes as the circuits; the 100% point is a measured circuit too, never assumed to be 1). Then,
on the x axis of those fractions (0.001 .. 1, linear, not normalised: a curve at 1 everywhere has area 0.999),

    CPR = sum over consecutive sizes i of (x_{i+1} - x_i) (f_i + f_{i+1}) / 2            (higher is better)
    CMD = sum over consecutive sizes i of (x_{i+1} - x_i) (|1 - f_i| + |1 - f_{i+1}|) / 2  (lower is better)

trapezoids through the ten measured points, nothing added at 0 (MIB's curve starts at 0.1%). CMD's trapezoids take
|1 - f| at the points, as MIB does, not the exact area of |1 - f| where f crosses 1 between two points.
"""

import math
from collections.abc import Sequence

import pandas as pd
import torch
from torch import Tensor

from headcount.circuits.bootstrap import resample_counts
from headcount.circuits.faithfulness import faithfulness_curve, ratios
from headcount.circuits.forward import NodeOutputs
from headcount.circuits.graph import Graph
from headcount.circuits.metric import Metric
from headcount.errors import ConfigError
from headcount.model.transformer import Transformer

MIB_PER_MILLE = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
MIB_FRACTIONS = tuple(p / 1000 for p in MIB_PER_MILLE)


def mib_sizes(n_edges: int) -> list[int]:
    """The circuit sizes MIB evaluates for a model of n_edges edges: floor(fraction * n_edges) per fraction."""
    if n_edges < 1:
        raise ConfigError("circuits.n_edges", n_edges, "a model has at least one edge")
    return [n_edges * p // 1000 for p in MIB_PER_MILLE]


def curve_areas(fractions: Sequence[float], faithfulness: Sequence[float]) -> dict[str, float]:
    """{"cpr", "cmd"}: the trapezoid areas under f and under |1 - f| over the given x (fractions of edges)."""
    x, f = [float(v) for v in fractions], [float(v) for v in faithfulness]
    if len(x) != len(f) or len(x) < 2:
        raise ConfigError("circuits.curve", f"{len(x)} sizes, {len(f)} values", "give as many values as sizes, >= 2")
    if any(b <= a for a, b in zip(x, x[1:])):
        raise ConfigError("circuits.curve", x, "the sizes must increase strictly")
    if not all(math.isfinite(v) for v in x + f):
        raise ConfigError("circuits.curve", f, "every size and faithfulness must be finite (m(full) = m(empty)?)")
    cpr = sum((x1 - x0) * (f0 + f1) / 2 for x0, x1, f0, f1 in zip(x, x[1:], f, f[1:]))
    cmd = sum((x1 - x0) * (abs(1 - f0) + abs(1 - f1)) / 2 for x0, x1, f0, f1 in zip(x, x[1:], f, f[1:]))
    return {"cpr": cpr, "cmd": cmd}


def mib_points(curve: pd.DataFrame, n_edges: int) -> pd.DataFrame:
    """The ten MIB points of a faithfulness curve (faithfulness_curve's table: method, n, draw, faithfulness, ...)
    per method and draw: columns method, draw, fraction, n, edges, faithfulness. A size the curve lacks is a
    one-line error, never filled in."""
    rows = []
    for (method, draw), group in curve.groupby(["method", "draw"], sort=False):
        at = group.drop_duplicates("n").set_index("n")
        for fraction, n in zip(MIB_FRACTIONS, mib_sizes(n_edges)):
            if n not in at.index:
                raise ConfigError("circuits.curve", f"{method} lacks n = {n}", f"MIB's sizes: {mib_sizes(n_edges)}")
            point = at.loc[n]
            rows.append(
                {
                    "method": method,
                    "draw": int(draw),
                    "fraction": fraction,
                    "n": n,
                    "edges": int(point["edges"]),
                    "faithfulness": float(point["faithfulness"]),
                }
            )
    return pd.DataFrame(rows, columns=["method", "draw", "fraction", "n", "edges", "faithfulness"])


def mib_areas(points: pd.DataFrame) -> pd.DataFrame:
    """CPR and CMD per method and draw of mib_points' table: columns method, draw, cpr, cmd."""
    rows = []
    for (method, draw), group in points.groupby(["method", "draw"], sort=False):
        group = group.sort_values("fraction")
        rows.append({"method": method, "draw": draw, **curve_areas(group["fraction"], group["faithfulness"])})
    return pd.DataFrame(rows, columns=["method", "draw", "cpr", "cmd"])


def faithfulness_intervals(sums_BN: Tensor, counts_RP: Tensor, level: float = 0.95) -> tuple[Tensor, Tensor]:
    """(low, high), one per curve row: each circuit's faithfulness over resamples of the prompts, its percentile
    interval (sums_BN: faithfulness_curve(per_example=True)'s per-prompt sums)."""
    if not 0 < level < 1:
        raise ConfigError("bootstrap.level", level, "a confidence level strictly between 0 and 1, e.g. 0.95")
    tails = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    low, high = torch.quantile(ratios(counts_RP.double() @ sums_BN), tails, dim=0)
    return low, high


def area_intervals(
    curve: pd.DataFrame, sums_BN: Tensor, n_edges: int, counts_RP: Tensor, level: float = 0.95
) -> pd.DataFrame:
    """Percentile intervals of CPR and CMD over resamples of the prompts (circuits/bootstrap.py): per resample, every
    circuit's faithfulness from the resampled per-prompt sums (faithfulness_curve(per_example=True): clean, every
    edge removed, then the curve's rows), then its areas at MIB's sizes. Columns: method, draw, cpr_ci_low,
    cpr_ci_high, cmd_ci_low, cmd_ci_high."""
    if not 0 < level < 1:
        raise ConfigError("bootstrap.level", level, "a confidence level strictly between 0 and 1, e.g. 0.95")
    f_RN = ratios(counts_RP.double() @ sums_BN)  # (R, curve rows)
    width = torch.tensor(MIB_FRACTIONS[1:], dtype=torch.float64) - torch.tensor(MIB_FRACTIONS[:-1])
    tails = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    rows = []
    for (method, draw), group in curve.reset_index(drop=True).groupby(["method", "draw"], sort=False):
        at = {int(n): i for i, n in zip(group.index, group["n"])}
        f_RS = f_RN[:, [at[n] for n in mib_sizes(n_edges)]]
        cpr_R = ((f_RS[:, 1:] + f_RS[:, :-1]) / 2 * width).sum(1)
        cmd_R = (((1 - f_RS[:, 1:]).abs() + (1 - f_RS[:, :-1]).abs()) / 2 * width).sum(1)
        (cpr_low, cmd_low), (cpr_high, cmd_high) = torch.quantile(torch.stack([cpr_R, cmd_R], 1), tails, dim=0)
        rows.append(
            {
                "method": method,
                "draw": int(draw),
                "cpr_ci_low": float(cpr_low),
                "cpr_ci_high": float(cpr_high),
                "cmd_ci_low": float(cmd_low),
                "cmd_ci_high": float(cmd_high),
            }
        )
    return pd.DataFrame(rows)


def method_areas(areas: pd.DataFrame) -> dict[str, dict[str, float]]:
    """method -> {"cpr", "cmd"}: each method's areas (and their intervals where areas has them); random circuits' as
    the mean over their draws, with the lowest and highest draw's (cpr_min, cpr_max, cmd_min, cmd_max)."""
    scores: dict[str, dict[str, float]] = {}
    for method, group in areas.groupby("method", sort=False):
        entry = {"cpr": float(group["cpr"].mean()), "cmd": float(group["cmd"].mean())}
        if len(group) == 1 and "cpr_ci_low" in group:
            bounds = ("cpr_ci_low", "cpr_ci_high", "cmd_ci_low", "cmd_ci_high")
            entry |= {key: float(group[key].iloc[0]) for key in bounds}
        if len(group) > 1:
            for key in ("cpr", "cmd"):
                entry |= {f"{key}_min": float(group[key].min()), f"{key}_max": float(group[key].max())}
        scores[str(method)] = entry
    return scores


def circuit_performance(
    model: Transformer,
    clean_ids_BT: Tensor,
    corrupted_ids_BT: Tensor | NodeOutputs,
    scores: dict[str, Tensor],
    metric: Metric,
    score_positions_B: Tensor | None = None,
    memory_budget: int | None = None,
    resamples: int = 0,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """MIB's evaluation of edge rankings (name -> (E,) scores, ranked by |score|): (points, areas), the ten
    measured points of each ranking's curve (mib_points) and its CPR and CMD (mib_areas), every circuit evaluated
    exactly in edge-patched passes sized to memory_budget. With resamples, areas also has the level percentile
    intervals of CPR and CMD over that many seeded resamples of the prompts (area_intervals)."""
    n_edges = len(Graph.of(model).edges)
    for name, values in scores.items():
        if tuple(values.shape) != (n_edges,):
            shape = tuple(values.shape)
            raise ConfigError("circuits.scores", name, f"needs one score per edge ({n_edges}), has shape {shape}")
    sizes = sorted(set(mib_sizes(n_edges)))
    args = (model, clean_ids_BT, corrupted_ids_BT, scores, sizes, metric, score_positions_B)
    curve, sums_BN = faithfulness_curve(*args, random_draws=0, memory_budget=memory_budget, per_example=True)
    points = mib_points(curve, n_edges)
    areas = mib_areas(points)
    if resamples:
        counts = resample_counts(len(sums_BN), resamples, seed)
        areas = areas.merge(area_intervals(curve, sums_BN, n_edges, counts, level), on=["method", "draw"])
    return points, areas


def ranking_scores(graph: Graph, ranking: Sequence[int] | Tensor) -> Tensor:
    """(E,) float64 scores that rank edges as an ordered list of edge indices does (first: most important); edges
    not listed score 0, after every listed one."""
    order = ranking.tolist() if isinstance(ranking, Tensor) else list(ranking)
    if len(set(order)) != len(order):
        raise ConfigError("circuits.ranking", order, "lists an edge twice")
    scores = torch.zeros(len(graph.edges), dtype=torch.float64)
    scores[order] = torch.arange(len(order), 0, -1, dtype=torch.float64)
    return scores

"""`Run.evaluate` with edges: the metric of the model with a set of edges corrupted, exactly, on the run's data or a
task, in any metric and any mode that corrupts every sender (mean does not).

Each receiver input reads the clean output of every sender whose edge into it is kept and the mode's replacement from
every sender whose edge is removed (the edge-patched forward, headcount/circuits/forward.py; docs/DESIGN.md,
"Circuits"). Two ways to name what is removed:

- `edges_removed`: these edges removed, every other edge kept (one edge: the edge_attribution scan's `exact` score);
- `circuit`: these edges kept, every other edge removed (the faithfulness definition, circuits/faithfulness.py).

Edges are named as the scans name them (`L0H3 -> L1H2.k`, `emb -> logits`, `L1.mlp -> logits`). The table has a row per
edge set with the columns `Run.evaluate` gives a head mask (mask: the set's name, mode, the metric's columns, their
deltas against the clean model, gap_fraction on a task with corrupted prompts, then how it was computed) but layer and
head, `n_edges_removed` in place of `n_heads_off`, and `faithfulness`: (M(set) - M(every edge removed)) / (M(clean) -
M(every edge removed)) on the metric's primary column, 1 for the whole model, 0 with every edge removed. The clean and
every-edge-removed runs are two more rows of the same edge-patched passes, so every number is one computation's. Writes
nothing.
"""

from collections.abc import Mapping, Sequence

import pandas as pd
import torch

from headcount.ablation.engine.evaluation import EvaluationSet, counterpart_baseline
from headcount.ablation.scans.circuit_inputs import check_edge_mode, edge_inputs
from headcount.circuits import Graph, circuit_performance, edge_metric
from headcount.circuits.cpr import ranking_scores
from headcount.config.ablation import AblationConfig
from headcount.errors import ConfigError

EdgeSets = str | Sequence[str] | Mapping[str, str | Sequence[str]]
Ranking = Sequence[str] | Mapping[str, float]
Rankings = Ranking | Mapping[str, Ranking]
RANKING = "an edge ranking: a list of edge names, most important first, or a mapping edge name -> score (by |score|)"
ALLOWED = "a list of edge names such as ['L0H3 -> L1H2.k', 'L1.mlp -> logits'], or a mapping name -> such a list"


def edge_sets(graph: Graph, spec: EdgeSets, key: str) -> list[tuple[str, list[int]]]:
    """(row name, edge indices) per set: a list (or one name) is one set, named after the argument `key`; a mapping
    gives one set per name. Every edge is checked by the graph: one line naming `key`, the edge, what is wrong and the
    closest name."""
    if isinstance(spec, str) or (isinstance(spec, Sequence) and not isinstance(spec, bytes)):
        named = {key: spec}
    elif isinstance(spec, Mapping):
        named = dict(spec)
    else:
        raise ConfigError(key, spec, ALLOWED)
    sets = []
    for name, edges in named.items():
        names = [edges] if isinstance(edges, str) else edges
        if not isinstance(names, Sequence) or not all(isinstance(e, str) for e in names):
            raise ConfigError(key, edges, ALLOWED)
        sets.append((str(name), sorted({edge_index(graph, edge, key) for edge in names})))
    if not sets:
        raise ConfigError(key, spec, "give at least one edge set (an empty list is one set: no edge)")
    return sets


def edge_index(graph: Graph, edge: str, key: str) -> int:
    """The index of the edge `edge` names; the graph's one-line error names the whole edge where it named a part."""
    try:
        return graph.edges_named([edge], key)[0]
    except ConfigError as error:
        if error.value == edge:
            raise
        raise ConfigError(key, edge, f"{error.value}: {error.allowed}") from None


def requested_edge_sets(
    model, removed: EdgeSets | None, kept: EdgeSets | None, s: AblationConfig
) -> list[tuple[str, list[int]]]:
    """The edge sets Run.evaluate was given (removed, or kept), checked before any work: a mode that corrupts every
    sender, and every edge's name."""
    key = "edges_removed" if removed is not None else "circuit"
    check_edge_mode(s.mode, "mode", f"evaluating {key}")
    return edge_sets(Graph.of(model), removed if removed is not None else kept, key)


def evaluate_edges(
    model, sets: list[tuple[str, list[int]]], removed: bool, s: AblationConfig, planned, data: EvaluationSet, evaluated
) -> tuple[pd.DataFrame, int]:
    """Run.evaluate's table for the edge sets `sets` removed (`removed`) or kept, under settings `s` and the plan
    (mode, metric, task) Run.evaluate made from them, on the evaluation set `data` and its batches as the mode
    prepared them (`evaluated`), before its record columns; and the number of score points those columns report."""
    graph, device = Graph.of(model), next(model.parameters()).device
    inputs, targets = edge_inputs(evaluated.batches, planned.mode, model, s.memory_budget_mb, "task")
    weights = torch.zeros(len(sets) + 2, len(graph.edges), dtype=torch.float64)
    weights[1] = 1.0  # row 0: the clean model; row 1: every edge removed (the corrupted run)
    for row, (_, edges) in enumerate(sets, start=2):
        if removed:
            weights[row, edges] = 1.0
        else:
            weights[row] = 1.0
            weights[row, edges] = 0.0
    metric = planned.metric
    values = {
        column: edge_metric(
            model,
            inputs.clean_ids_BT,
            inputs.corrupted,
            weights,
            inputs.metric(metric, targets, k),
            inputs.points_BT,
            memory_budget=inputs.memory_budget,
        ).cpu()
        / inputs.n_points
        for k, column in enumerate(metric.columns)
    }
    table = pd.DataFrame({"mask": [name for name, _ in sets], "mode": s.mode})
    for column, value in values.items():
        table[column] = value[2:].numpy()
    for column, value in values.items():
        table[f"delta_{column}"] = (value[2:] - value[0]).numpy()
    primary = values[metric.primary]
    counterpart = counterpart_baseline(s, metric, model, data, device)
    if counterpart is not None:
        gap = counterpart[metric.primary] - float(primary[0])
        table["gap_fraction"] = (primary[2:] - primary[0]).numpy() / gap if gap != 0 else float("nan")
    table["n_edges_removed"] = weights[2:].sum(1).long().numpy()
    span = float(primary[0] - primary[1])
    table["faithfulness"] = ((primary[2:] - primary[1]) / span).numpy() if span != 0 else float("nan")
    return table, inputs.n_points


def rankings(graph: Graph, spec: Rankings, key: str = "scores") -> dict[str, torch.Tensor]:
    """name -> (E,) scores per ranking: one ranking (named "ranking" for a list, "scores" for a mapping of edges to
    numbers) or a mapping name -> ranking. A list ranks its edges first to last; a mapping by |score|; an edge not
    named scores 0, after every named one. Every edge name is checked by the graph."""
    single = isinstance(spec, Sequence) and not isinstance(spec, str)
    if isinstance(spec, Mapping) and all(isinstance(v, int | float) for v in spec.values()):
        single = True
    named = {("ranking" if isinstance(spec, Sequence) else "scores"): spec} if single else spec
    if not isinstance(named, Mapping) or not named:
        raise ConfigError(key, spec, RANKING)
    scores = {}
    for name, ranking in named.items():
        if isinstance(ranking, Sequence) and not isinstance(ranking, str) and all(isinstance(e, str) for e in ranking):
            order = [edge_index(graph, edge, key) for edge in ranking]
            scores[str(name)] = ranking_scores(graph, order)
        elif isinstance(ranking, Mapping) and all(isinstance(v, int | float) for v in ranking.values()):
            values = torch.zeros(len(graph.edges), dtype=torch.float64)
            for edge, value in ranking.items():
                values[edge_index(graph, edge, key)] = float(value)
            scores[str(name)] = values
        else:
            raise ConfigError(key, ranking, RANKING)
    return scores


def checked_rankings(model, spec: Rankings, s: AblationConfig, resamples: int) -> dict[str, torch.Tensor]:
    """The rankings Run.circuit_performance was given, checked before any work (the resamples, the mode, every edge
    name), as scores per edge."""
    if not isinstance(resamples, int) or resamples < 0:
        raise ConfigError("resamples", resamples, "an integer >= 0 (0: no intervals)")
    check_edge_mode(s.mode, "mode", "scoring edge rankings")
    return rankings(Graph.of(model), spec)


def score_rankings(
    model,
    scores: dict[str, torch.Tensor],
    s: AblationConfig,
    planned,
    evaluated,
    resamples: int = 1000,
    level: float = 0.95,
) -> tuple[pd.DataFrame, int]:
    """Run.circuit_performance's table: per ranking, MIB's CPR and CMD with their percentile intervals over
    `resamples` resamples of the prompts (seeded by ablation.seed; none with 0) and the faithfulness of its top-n
    circuit (pruned) at each of MIB's sizes (columns f_0.1% .. f_100%, and edges_0.1% .. the pruned circuits'
    sizes), every circuit evaluated exactly on the metric's primary column; the evaluation set and its number of
    score points."""
    inputs, targets = edge_inputs(evaluated.batches, planned.mode, model, s.memory_budget_mb, "task")
    metric = inputs.metric(planned.metric, targets, planned.metric.columns.index(planned.metric.primary))
    args = (model, inputs.clean_ids_BT, inputs.corrupted, scores, metric, inputs.points_BT, inputs.memory_budget)
    points, areas = circuit_performance(*args, resamples=resamples, seed=s.seed, level=level)
    table = areas.drop(columns="draw")
    for column, values in (("f", "faithfulness"), ("edges", "edges")):
        wide = points.pivot(index="method", columns="fraction", values=values)
        wide.columns = [f"{column}_{fraction * 100:g}%" for fraction in wide.columns]
        table = table.join(wide, on="method")
    table.insert(1, "mode", s.mode)
    return table, inputs.n_points

"""Circuits and their faithfulness.

A circuit is a set of kept edges (indices into Graph.of(model).edges). Its faithfulness is

    F(circuit) = (M(edges outside the circuit removed) - M(every edge removed)) / (M(clean) - M(every edge removed))

with M the metric of the edge-patched forward (forward.py; removing every edge is the corrupted run), so the full
circuit scores 1 and the empty one 0.

Discovery keeps the top n edges by |score| (any score: exact, EAP, EAP-IG), then prunes the edges that cannot carry
anything from the embeddings to the logits inside the circuit: an edge s -> r stays when s is reached from emb by kept
edges and r's node reaches the logits by kept edges (a head counts as reached when any of its q, k, v inputs is). The
pruned circuit may hold fewer than n edges; the curve reports both. Random circuits draw n edges uniformly and are
pruned the same way.
"""

import pandas as pd
import torch
from torch import Tensor

from headcount.circuits.attribution import edge_point_values
from headcount.circuits.forward import NodeOutputs
from headcount.circuits.graph import Graph, Node
from headcount.circuits.metric import Metric, points_mask
from headcount.errors import ConfigError
from headcount.model.transformer import Transformer


def prune(graph: Graph, edges: set[int]) -> set[int]:
    """The edges of `edges` on some path emb -> ... -> logits made of kept edges."""
    reached: set[Node] = {Node("emb")}
    for i, e in enumerate(graph.edges):  # every edge into a node comes before every edge out of it
        if i in edges and e.sender in reached:
            reached.add(e.receiver.node)
    useful: set[Node] = {Node("logits", graph.n_layers)}
    for i in reversed(range(len(graph.edges))):
        e = graph.edges[i]
        if i in edges and e.receiver.node in useful:
            useful.add(e.sender)
    return {i for i in edges if graph.edges[i].sender in reached and graph.edges[i].receiver.node in useful}


def top_edges(graph: Graph, scores: Tensor, n: int) -> set[int]:
    """The n edges of largest |score|, pruned."""
    if not 0 <= n <= len(graph.edges):
        raise ConfigError("circuits.size", n, f"must lie in 0..{len(graph.edges)} (the model's edges)")
    return prune(graph, set(scores.abs().argsort(descending=True)[:n].tolist()))


def faithfulness(
    model: Transformer,
    clean_ids_BT: Tensor,
    corrupted_ids_BT: Tensor | NodeOutputs,
    circuits: list[set[int]],
    metric: Metric,
    score_positions_B: Tensor | None = None,
    memory_budget: int | None = None,
) -> Tensor:
    """(K,) float64: each circuit's faithfulness, all in edge-patched passes sized to memory_budget bytes (None: the
    default budget, passes.py)."""
    args = (model, clean_ids_BT, corrupted_ids_BT, circuits, metric, score_positions_B, memory_budget)
    return ratios(circuit_metrics(*args).sum(0))


def ratios(sums_N: Tensor) -> Tensor:
    """Faithfulness from metric sums [clean, every edge removed, circuits...] (the last dimension)."""
    return (sums_N[..., 2:] - sums_N[..., 1:2]) / (sums_N[..., :1] - sums_N[..., 1:2])


def circuit_metrics(
    model: Transformer,
    clean_ids_BT: Tensor,
    corrupted_ids_BT: Tensor | NodeOutputs,
    circuits: list[set[int]],
    metric: Metric,
    score_positions_B: Tensor | None = None,
    memory_budget: int | None = None,
) -> Tensor:
    """(B, K + 2) float64: each prompt's metric (its points summed) with nothing removed, every edge removed and each
    circuit kept, in that order: the sums faithfulness divides, per prompt, which the bootstrap resamples."""
    n_edges = len(Graph.of(model).edges)
    weights = torch.ones(len(circuits) + 2, n_edges, dtype=torch.float64)
    weights[0] = 0.0  # clean; row 1: every edge removed
    for k, circuit in enumerate(circuits):
        weights[k + 2, list(circuit)] = 0.0
    args = (model, clean_ids_BT, corrupted_ids_BT, weights, metric, score_positions_B, None, memory_budget)
    values_NP = edge_point_values(*args)
    prompt_P = points_mask(clean_ids_BT, score_positions_B).nonzero()[:, 0].cpu()
    sums_BN = torch.zeros(len(clean_ids_BT), len(weights), dtype=torch.float64)
    return sums_BN.index_add_(0, prompt_P, values_NP.T)


def faithfulness_curve(
    model: Transformer,
    clean_ids_BT: Tensor,
    corrupted_ids_BT: Tensor | NodeOutputs,
    scores: dict[str, Tensor],
    sizes: list[int],
    metric: Metric,
    score_positions_B: Tensor | None = None,
    random_draws: int = 5,
    seed: int = 0,
    memory_budget: int | None = None,
    per_example: bool = False,
) -> pd.DataFrame | tuple[pd.DataFrame, Tensor]:
    """Faithfulness against n: per scoring method (name -> (E,) scores) and per size n, the top-n circuit; and
    `random_draws` random circuits per n ("random", seeded), in passes sized to memory_budget. Columns: method, n,
    edges (after pruning), draw, faithfulness. per_example: also circuit_metrics' (B, rows + 2) per-prompt sums, row
    i of the table in column i + 2."""
    rows, circuits = curve_circuits(Graph.of(model), scores, sizes, random_draws, seed)
    args = (model, clean_ids_BT, corrupted_ids_BT, circuits, metric, score_positions_B, memory_budget)
    sums_BN = circuit_metrics(*args)
    table = curve_table(rows, circuits, sums_BN)
    return (table, sums_BN) if per_example else table


def curve_circuits(
    graph: Graph, scores: dict[str, Tensor], sizes: list[int], random_draws: int, seed: int
) -> tuple[list[dict], list[set[int]]]:
    """The curve's rows (method, n, draw) and their circuits: each method's top n, then the seeded random draws."""
    generator = torch.Generator().manual_seed(seed)
    rows, circuits = [], []
    for method, method_scores in scores.items():
        for n in sizes:
            circuits.append(top_edges(graph, method_scores, n))
            rows.append({"method": method, "n": n, "draw": 0})
    for n in sizes:
        for draw in range(random_draws):
            chosen = torch.randperm(len(graph.edges), generator=generator)[:n].tolist()
            circuits.append(prune(graph, set(chosen)))
            rows.append({"method": "random", "n": n, "draw": draw})
    return rows, circuits


def curve_table(rows: list[dict], circuits: list[set[int]], sums_BN: Tensor) -> pd.DataFrame:
    """The curve from its rows, their circuits and circuit_metrics' per-prompt sums of them."""
    rows = [dict(row) for row in rows]
    for row, circuit, value in zip(rows, circuits, ratios(sums_BN.sum(0)).tolist()):
        row.update(edges=len(circuit), faithfulness=value)
    return pd.DataFrame(rows, columns=["method", "n", "edges", "draw", "faithfulness"])

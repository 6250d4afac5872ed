"""Edge scores: exact (one edge-patched forward per edge), EAP and EAP-IG (one or a few forward and backward passes).

With M(a) the metric (summed over the points) of the edge-patched forward at edge weights a (forward.py; a_e = 1
removes edge e), every score is an effect M(removed) - M(clean):

- exact: M(e_e) - M(0), the edge removed alone (equal to path patching of that single edge, path_patching.py);
- EAP (Syed et al. 2023): the first-order term dM/da_e at a = 0, which is (out'_s - out_s) . dM/dx_r for an edge
  s -> r in pre-norm families (the classic formula: corrupted minus clean sender output, dotted with the metric's
  gradient at the receiver input). Into a post-norm layer's attention the same derivative is taken through the exact
  per-layer definition, (z'_h - z_h) . dM/dz_h read through that receiver's post_norm(combine(.)): it is the first-
  order term of the exact definition, not of a per-head sum that the post-norm does not have. One clean forward, one
  corrupted forward (cached) and one backward to the N x E weights;
- EAP-IG (Hanna et al. 2024): (out'_s - out_s) . (1/m) sum_{k=1..m} dM/dx_r at the run whose input embeddings are
  emb' + (k/m)(emb - emb'), the corrupted-to-clean straight line in embedding space (their "inputs" variant;
  right Riemann sum, the clean end included); out and out' stay the clean and corrupted runs' outputs. The m
  interpolations run as one batch of m * B rows, one backward.

`ranking_agreement` compares an estimate with exact scores: rank correlation and top-k recall by |score|.
"""

import pandas as pd
import torch
from torch import Tensor

from headcount.circuits.forward import NodeOutputs, edge_forward, node_outputs, outputs_of
from headcount.circuits.graph import Graph
from headcount.circuits.metric import Metric, last_positions, metric_sums
from headcount.errors import ConfigError
from headcount.model.transformer import Transformer


def edge_metric(
    model: Transformer,
    clean_ids_BT: Tensor,
    corrupted_ids_BT: Tensor | NodeOutputs,
    weights_NE: Tensor,
    metric: Metric,
    score_positions_B: Tensor | None = None,
    rows_per_pass: int = 64,
) -> Tensor:
    """(N,) float64: the metric of the edge-patched forward at each row of edge weights (1 = removed), in passes of
    rows_per_pass rows."""
    positions = last_positions(clean_ids_BT) if score_positions_B is None else score_positions_B
    corrupted = outputs_of(model, corrupted_ids_BT)
    sums = []
    with torch.no_grad():
        emb = model.embed(clean_ids_BT)
        for chunk in weights_NE.split(rows_per_pass):
            logits, _ = edge_forward(model, emb, chunk.to(emb.dtype), corrupted)
            sums.append(metric_sums(logits, positions, metric))
    return torch.cat(sums)


def exact_edge_scores(
    model: Transformer,
    clean_ids_BT: Tensor,
    corrupted_ids_BT: Tensor | NodeOutputs,
    metric: Metric,
    score_positions_B: Tensor | None = None,
    edges: list[int] | None = None,
    rows_per_pass: int = 64,
) -> Tensor:
    """(E,) float64 (or one per index in `edges`): M(edge removed alone) - M(clean)."""
    n_edges = len(Graph.of(model).edges)
    chosen = list(range(n_edges)) if edges is None else edges
    weights = torch.zeros(len(chosen) + 1, n_edges, dtype=torch.float64)
    weights[torch.arange(len(chosen)) + 1, chosen] = 1.0  # row 0: nothing removed
    sums = edge_metric(model, clean_ids_BT, corrupted_ids_BT, weights, metric, score_positions_B, rows_per_pass)
    return sums[1:] - sums[0]


def eap_scores(
    model: Transformer,
    clean_ids_BT: Tensor,
    corrupted_ids_BT: Tensor | NodeOutputs,
    metric: Metric,
    score_positions_B: Tensor | None = None,
) -> Tensor:
    """(E,) float64: EAP's first-order estimate of every edge's exact score."""
    positions = last_positions(clean_ids_BT) if score_positions_B is None else score_positions_B
    corrupted = outputs_of(model, corrupted_ids_BT)
    emb = model.embed(clean_ids_BT).detach()
    weights = emb.new_zeros(1, len(Graph.of(model).edges), requires_grad=True)
    logits, _ = edge_forward(model, emb, weights, corrupted)
    (grad,) = torch.autograd.grad(metric_sums(logits, positions, metric).sum(), weights)
    return grad[0].double()


def eap_ig_scores(
    model: Transformer,
    clean_ids_BT: Tensor,
    corrupted_ids_BT: Tensor | NodeOutputs,
    metric: Metric,
    steps: int = 5,
    score_positions_B: Tensor | None = None,
) -> Tensor:
    """(E,) float64: EAP-IG with `steps` interpolations of the input embeddings between corrupted and clean."""
    if not isinstance(steps, int) or steps < 1:
        raise ConfigError("edge_attribution.steps", steps, "EAP-IG needs an integer number of steps >= 1")
    positions = last_positions(clean_ids_BT) if score_positions_B is None else score_positions_B
    clean, corrupted = node_outputs(model, clean_ids_BT), outputs_of(model, corrupted_ids_BT)
    alpha_N = torch.arange(1, steps + 1, dtype=clean.emb.dtype) / steps
    emb_NBTC = corrupted.emb + alpha_N[:, None, None, None] * (clean.emb - corrupted.emb)
    weights = clean.emb.new_zeros(steps, len(Graph.of(model).edges), requires_grad=True)
    logits, _ = edge_forward(model, emb_NBTC, weights, corrupted, reference=clean)
    (grad,) = torch.autograd.grad(metric_sums(logits, positions, metric).sum(), weights)
    return grad.double().mean(0)


def ranking_agreement(estimate: Tensor, exact: Tensor, k: int) -> dict[str, float]:
    """How well estimated edge scores rank edges as the exact scores do, by |score|: Spearman's rank correlation
    (average ranks for ties) and the top-k recall, the share of the exact top k that the estimate's top k holds."""
    if not 1 <= k <= len(exact):
        raise ConfigError("edge_attribution.verify_top_k", k, f"must lie in 1..{len(exact)} (the edges scored)")
    ranks = [pd.Series(s.abs().double().cpu().numpy()).rank() for s in (estimate, exact)]
    top = [set(s.abs().argsort(descending=True)[:k].tolist()) for s in (estimate, exact)]
    return {"spearman": float(ranks[0].corr(ranks[1])), "top_k_recall": len(top[0] & top[1]) / k}

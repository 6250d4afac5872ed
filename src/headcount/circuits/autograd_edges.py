"""EAP and EAP-IG as what they are defined to be, the edge-patched forward's gradient in the edge weights at a = 0,
taken by autograd through that forward (forward.py): for models whose stream is not a sum of its senders' outputs.

In a post-LN block (BERT, RoBERTa, DistilBERT, ELECTRA, MiniLM) the stream is normalised after every addition, so a
receiver's input is the blocks' additions and norms applied to its senders' outputs (forward.py's receiver_inputs)
and d x_r / d a_{s->r} is the Jacobian of every norm between s and r times (out'_s - out_s), not (out'_s - out_s)
itself: gradients.py's one-backward product, which assumes the sum, does not hold there. Here every receiver reads its
own input through the edge weights, a (N, E) tensor that requires its gradient, and one backward per pass gives
dM/da for every edge at once:

- EAP: the gradient at a = 0 on the clean run, the mix's reference the clean outputs (x = out + a (out' - clean));
- EAP-IG: the mean of the gradients at a = 0 of the m runs whose input embeddings are emb' + (k/m)(emb - emb'),
  k = 1..m, the reference still the clean run (the same definition as attribution.py's).

It costs one forward in which each receiver rebuilds its input through the norms before it (about receivers x layers
norms of the stream) and its backward, per pass of examples (per example when per_example, so that each example's
sum is its own).
"""

import dataclasses

import torch
from torch import Tensor

from headcount.circuits.forward import NodeOutputs, edge_stream, node_outputs
from headcount.circuits.graph import Graph
from headcount.circuits.metric import Metric, metric_at, point_values, points_mask
from headcount.circuits.passes import budget_of, edge_unit_bytes, example_bytes, plan_passes
from headcount.model.transformer import Transformer


def autograd_edge_scores(
    model: Transformer,
    clean_ids_BT: Tensor,
    corrupted_ids_BT: Tensor | NodeOutputs,
    metric: Metric,
    steps: int | None = None,
    score_positions_B: Tensor | None = None,
    memory_budget: int | None = None,
    per_example: bool = False,
) -> Tensor:
    """(E,) float64 in Graph.edges' order: EAP (steps None) or EAP-IG with `steps` interpolations, each the edge
    forward's own gradient; per_example: (B, E), each example's points summed apart."""
    graph = Graph.of(model)
    points_BT = points_mask(clean_ids_BT, score_positions_B)
    B, T = points_BT.shape
    runs = 1 if steps is None else steps
    points = int(points_BT.sum(1).max()) if B else 0
    plan = plan_passes(
        unit_bytes(model, T, points), example_bytes(model, T, 3), runs, B, budget_of(model, memory_budget)
    )
    if per_example:
        plan = dataclasses.replace(plan, examples=1)
    sums = torch.zeros(B if per_example else 1, len(graph.edges), dtype=torch.float64)
    ends = [0, *points_BT.sum(1).cumsum(0).tolist()]
    for examples in plan.example_chunks(B):
        columns = slice(ends[examples.start], ends[examples.stop])
        clean = node_outputs(model, clean_ids_BT[examples])
        corrupted = outputs_of_examples(model, corrupted_ids_BT, examples)
        at = examples if per_example else 0
        for rows in plan.row_chunks(runs):
            emb_NBTC = run_embeddings(clean, corrupted, rows, steps)
            weights_NE = emb_NBTC.new_zeros(len(emb_NBTC), len(graph.edges)).requires_grad_()
            with torch.enable_grad():
                stream, _ = edge_stream(model, emb_NBTC, weights_NE, corrupted, clean)
                N = len(emb_NBTC)
                logits_NPV = model.unembed(stream.view(N, *points_BT[examples].shape, -1)[:, points_BT[examples]])
                values_NP = point_values(logits_NPV, metric_at(metric, columns))
                (grad_NE,) = torch.autograd.grad(values_NP.sum(), weights_NE)
            sums[at] += grad_NE.double().sum(0).cpu()
    return sums if per_example else sums[0] / runs


def run_embeddings(clean: NodeOutputs, corrupted: NodeOutputs, rows: slice, steps: int | None) -> Tensor:
    """(N, B, T, C): the clean embedding (EAP), or EAP-IG's steps rows.start+1 .. rows.stop on the line from the
    corrupted embedding to the clean one."""
    if steps is None:
        return clean.emb[None]
    alpha_N = torch.arange(rows.start + 1, rows.stop + 1, dtype=clean.emb.dtype, device=clean.emb.device) / steps
    return corrupted.emb + alpha_N[:, None, None, None] * (clean.emb - corrupted.emb)


def outputs_of_examples(model: Transformer, run: Tensor | NodeOutputs, examples: slice) -> NodeOutputs:
    """The corrupted run's outputs for these examples: run on their ids, or sliced from given outputs."""
    if isinstance(run, NodeOutputs):
        return NodeOutputs(run.emb[examples], [z[examples] for z in run.z], [m[examples] for m in run.mlp])
    return node_outputs(model, run[examples])


def unit_bytes(model: Transformer, T: int, points: int) -> int:
    """A generous estimate of one run of one example: the edge forward's (passes.edge_unit_bytes) and, kept for the
    backward, every receiver's rebuilt input, a norm's input and output per layer it passes, and their gradients."""
    graph, C = Graph.of(model), model.cfg.d_model
    rebuilt = sum(len(graph.layer_receivers(layer)) * 4 * (layer + 1) for layer in range(graph.n_layers))
    extra = 2 * T * C * (rebuilt + 4 * graph.n_layers)
    return edge_unit_bytes(model, T, points) + extra * next(model.parameters()).element_size()

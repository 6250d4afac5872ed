"""Edge scores: exact (one edge-patched forward per edge), EAP and EAP-IG (one or a few forward and backward passes).

With M(a) the metric (summed over the points) of the edge-patched forward at edge weights a (forward.py; a_e = 1
removes edge e), every score is an effect M(removed) - M(clean):

- exact: M(e_e) - M(0), the edge removed alone (equal to path patching of that single edge, path_patching.py);
- EAP (Syed et al. 2023): the first-order term dM/da_e at a = 0. At a = 0 every receiver reads the plain stream, so
  for an edge s -> r it is (out'_s - out_s as it enters the stream) . g_r, g_r = dM/dx_r the gradient at receiver
  r's own input (the classic formula: corrupted minus clean sender output, dotted with the metric's gradient at the
  receiver input), a head's output entering as (z'_h - z_h) W_O^h. Where attention passes a post-norm before the
  stream (Gemma 2/3, OLMo 2) a head's delta enters as J (z'_h - z_h) W_O^h, J the norm's Jacobian at the layer's
  combined output: the first-order term of the exact per-receiver definition post_norm(combine(z + a (z' - z))), not
  of a per-head sum that the post-norm does not have. Cost: a clean and a corrupted forward, one forward in which
  every receiver reads its own copy of the stream and one backward (gradients.py), then one matrix product per
  receiver layer for all its edges (EdgeGradients), per pass of examples;
- EAP-IG (Hanna et al. 2024): (out'_s - out_s) . (1/m) sum_{k=1..m} dM/dx_r at the run whose input embeddings are
  emb' + (k/m)(emb - emb'), the corrupted-to-clean straight line in embedding space (their "inputs" variant;
  right Riemann sum, the clean end included); out and out' stay the clean and corrupted runs' outputs (through a
  post-norm, J is each step's own). The m interpolations run as m * B rows of the same forward and backward, in passes
  of some steps of some examples; the gradients of the steps are summed before the products.

Both equal the gradient of the edge-patched forward in the edge weights (tests, float32 and float64), which stays
their definition. Every evaluation runs in passes sized to a memory budget (passes.py): exact metrics are sums over
all points in point order whatever the passes, EAP's dot products sums over the passes' examples in float64.

`ranking_agreement` compares an estimate with exact scores: rank correlation and top-k recall by |score|.
"""

import pandas as pd
import torch
from torch import Tensor

from headcount.circuits.autograd_edges import autograd_edge_scores
from headcount.circuits.forward import NodeOutputs, edge_stream, outputs_of
from headcount.circuits.gradients import ReceiverGradients, plain_outputs, receiver_gradients
from headcount.circuits.gradients import unit_bytes as gradient_unit_bytes
from headcount.circuits.graph import Graph
from headcount.circuits.metric import Metric, metric_at, point_values, points_mask
from headcount.circuits.passes import PassPlan, budget_of, edge_unit_bytes, example_bytes, plan_passes
from headcount.errors import ConfigError
from headcount.model.block import Block
from headcount.model.transformer import Transformer


def edge_metric(
    model: Transformer,
    clean_ids_BT: Tensor,
    corrupted_ids_BT: Tensor | NodeOutputs,
    weights_NE: Tensor,
    metric: Metric,
    score_positions_B: Tensor | None = None,
    rows_per_pass: int | None = None,
    memory_budget: int | None = None,
) -> Tensor:
    """(N,) float64: the metric of the edge-patched forward at each row of edge weights (1 = removed), summed over
    the points. Passes hold rows_per_pass rows (None: as many as fit) of as many examples as fit memory_budget bytes
    (None: the default budget, passes.py)."""
    args = (model, clean_ids_BT, corrupted_ids_BT, weights_NE, metric, score_positions_B, rows_per_pass)
    return edge_point_values(*args, memory_budget).sum(1)


def edge_point_values(
    model: Transformer,
    clean_ids_BT: Tensor,
    corrupted_ids_BT: Tensor | NodeOutputs,
    weights_NE: Tensor,
    metric: Metric,
    score_positions_B: Tensor | None = None,
    rows_per_pass: int | None = None,
    memory_budget: int | None = None,
) -> Tensor:
    """(N, P) float64: edge_metric's values at each of the P points (row-major in the points mask) before their sum,
    which the bootstrap over prompts resamples (circuits/bootstrap.py)."""
    points_BT = points_mask(clean_ids_BT, score_positions_B)
    plan = edge_plan(model, points_BT, len(weights_NE), memory_budget, rows_per_pass)
    values_NP = torch.empty(len(weights_NE), int(points_BT.sum()), dtype=torch.float64)
    with torch.no_grad():
        for examples, columns in example_chunks(plan, points_BT):
            corrupted = outputs_at(model, corrupted_ids_BT, examples)
            emb = model.embed(clean_ids_BT[examples])
            for rows in plan.row_chunks(len(weights_NE)):
                stream, _ = edge_stream(model, emb, weights_NE[rows].to(emb), corrupted)
                values_NP[rows, columns] = point_values(
                    logits_at(model, stream, points_BT[examples]), metric_at(metric, columns)
                )
    return values_NP


def edge_plan(
    model: Transformer,
    points_BT: Tensor,
    n_rows: int,
    memory_budget: int | None,
    rows: int | None = None,
    grad: bool = False,
    reference: bool = False,
) -> PassPlan:
    """The passes of an edge-patched evaluation of n_rows weight rows over the examples of points_BT; with grad, of
    EAP's gradient runs (n_rows: EAP-IG's steps; reference: EAP-IG's clean run held beside)."""
    B, T = points_BT.shape
    points = int(points_BT.sum(1).max()) if B else 0
    # with gradients, EAP's passes: one forward with per-receiver copies and its backward (gradients.py)
    unit = gradient_unit_bytes(model, T, points, reference) if grad else edge_unit_bytes(model, T, points)
    fixed = example_bytes(model, T, 3 if reference else 2)
    return plan_passes(unit, fixed, n_rows, B, budget_of(model, memory_budget), rows)


def example_chunks(plan: PassPlan, points_BT: Tensor) -> list[tuple[slice, slice]]:
    """Each pass's examples and the columns of their points in the point order (row-major: contiguous)."""
    ends = [0, *points_BT.sum(1).cumsum(0).tolist()]
    return [(ex, slice(ends[ex.start], ends[ex.stop])) for ex in plan.example_chunks(len(points_BT))]


def outputs_at(model: Transformer, run: Tensor | NodeOutputs, examples: slice) -> NodeOutputs:
    """The corrupted (or any) run's outputs for these examples: run on their ids, or sliced from given outputs."""
    if isinstance(run, NodeOutputs):
        return NodeOutputs(run.emb[examples], [z[examples] for z in run.z], [m[examples] for m in run.mlp])
    return outputs_of(model, run[examples])


def run_outputs(model: Transformer, run: Tensor | NodeOutputs, examples: slice) -> NodeOutputs:
    """outputs_at for EAP: a run on ids through gradients.plain_outputs, one pass through the layers."""
    return outputs_at(model, run, examples) if isinstance(run, NodeOutputs) else plain_outputs(model, run[examples])


def logits_at(model: Transformer, stream_RTC: Tensor, points_BT: Tensor) -> Tensor:
    """(N, P, V): the logits at the P points of each of the N runs stacked along the batch, unembedded there only."""
    N = stream_RTC.shape[0] // points_BT.shape[0]
    return model.unembed(stream_RTC.view(N, *points_BT.shape, -1)[:, points_BT])


def exact_edge_scores(
    model: Transformer,
    clean_ids_BT: Tensor,
    corrupted_ids_BT: Tensor | NodeOutputs,
    metric: Metric,
    score_positions_B: Tensor | None = None,
    edges: list[int] | None = None,
    rows_per_pass: int | None = None,
    memory_budget: int | None = None,
    per_example: bool = False,
) -> Tensor:
    """(E,) float64 (or one per index in `edges`): M(edge removed alone) - M(clean); per_example: (B, E), each
    example's points summed apart (their sum over examples is the (E,) scores)."""
    n_edges = len(Graph.of(model).edges)
    chosen = list(range(n_edges)) if edges is None else edges
    weights = torch.zeros(len(chosen) + 1, n_edges, dtype=torch.float64)
    weights[torch.arange(len(chosen)) + 1, chosen] = 1.0  # row 0: nothing removed
    args = (model, clean_ids_BT, corrupted_ids_BT, weights, metric, score_positions_B)
    if not per_example:
        sums = edge_metric(*args, rows_per_pass, memory_budget)
        return sums[1:] - sums[0]
    values_NP = edge_point_values(*args, rows_per_pass, memory_budget)
    points_BT = points_mask(clean_ids_BT, score_positions_B)
    prompt_P = points_BT.nonzero()[:, 0].cpu()  # the values are on the CPU, whatever device ran them
    sums_BN = torch.zeros(len(points_BT), len(values_NP), dtype=torch.float64).index_add_(0, prompt_P, values_NP.T)
    return sums_BN[:, 1:] - sums_BN[:, :1]


def eap_scores(
    model: Transformer,
    clean_ids_BT: Tensor,
    corrupted_ids_BT: Tensor | NodeOutputs,
    metric: Metric,
    score_positions_B: Tensor | None = None,
    memory_budget: int | None = None,
    per_example: bool = False,
) -> Tensor:
    """(E,) float64: EAP's first-order estimate of every edge's exact score, the passes' dot products added in
    float64; per_example: (B, E), each example's own dot products (their sum over examples is the (E,) scores),
    which the bootstrap over prompts resamples (circuits/bootstrap.py)."""
    if model.cfg.post_ln:  # the stream is no sum of senders: the edge forward's own gradient (autograd_edges.py)
        args = (model, clean_ids_BT, corrupted_ids_BT, metric, None, score_positions_B, memory_budget, per_example)
        return autograd_edge_scores(*args)
    points_BT = points_mask(clean_ids_BT, score_positions_B)
    plan = edge_plan(model, points_BT, 1, memory_budget, grad=True)
    scores = EdgeGradients(model, len(points_BT) if per_example else None)
    for examples, columns in example_chunks(plan, points_BT):
        scores.examples = examples
        corrupted = run_outputs(model, corrupted_ids_BT, examples)
        grads = receiver_gradients(
            model, model.embed(clean_ids_BT[examples]), points_BT[examples], metric_at(metric, columns)
        )
        delta = corrupted.minus(grads.outputs)
        scores.add(grads, delta)
        scores.contract(delta)
    return scores.edges()


def eap_ig_scores(
    model: Transformer,
    clean_ids_BT: Tensor,
    corrupted_ids_BT: Tensor | NodeOutputs,
    metric: Metric,
    steps: int = 5,
    score_positions_B: Tensor | None = None,
    memory_budget: int | None = None,
    per_example: bool = False,
) -> Tensor:
    """(E,) float64: EAP-IG with `steps` interpolations of the input embeddings between corrupted and clean, in
    passes of some steps of some examples, the dot products added in float64; per_example: (B, E), as for EAP."""
    if not isinstance(steps, int) or steps < 1:
        raise ConfigError("edge_attribution.steps", steps, "EAP-IG needs an integer number of steps >= 1")
    if model.cfg.post_ln:  # as in eap_scores
        args = (model, clean_ids_BT, corrupted_ids_BT, metric, steps, score_positions_B, memory_budget, per_example)
        return autograd_edge_scores(*args)
    points_BT = points_mask(clean_ids_BT, score_positions_B)
    plan = edge_plan(model, points_BT, steps, memory_budget, grad=True, reference=True)
    scores = EdgeGradients(model, len(points_BT) if per_example else None)
    for examples, columns in example_chunks(plan, points_BT):
        scores.examples = examples
        clean = plain_outputs(model, clean_ids_BT[examples])
        corrupted = run_outputs(model, corrupted_ids_BT, examples)
        delta = corrupted.minus(clean)
        for rows in plan.row_chunks(steps):
            alpha_N = (
                torch.arange(rows.start + 1, rows.stop + 1, dtype=clean.emb.dtype, device=clean.emb.device) / steps
            )
            emb_NBTC = corrupted.emb + alpha_N[:, None, None, None] * (clean.emb - corrupted.emb)
            grads = receiver_gradients(model, emb_NBTC.flatten(0, 1), points_BT[examples], metric_at(metric, columns))
            scores.add(grads, delta)
        scores.contract(delta)  # the steps share the deltas: one product for all of them
    return scores.edges() / steps


class EdgeGradients:
    """dM/da_{s->r} at a = 0 for every edge, summed over runs: the dot product of sender s's out'_s - out_s as it
    enters the stream with g_r, the run's gradient at receiver r's input (gradients.py), over examples, positions and
    channels. The edges into a layer's heads (then into its MLP, then into the logits) are one matrix product,
    (receiver inputs, B*T*C) x (B*T*C, senders they read), taken once on the gradients summed over the runs (`add`
    them, then `contract`: EAP-IG's steps share the deltas).

    A head's delta enters as (z'_h - z_h) W_O^h. Where its layer's attention passes a post-norm before the stream, it
    enters as J (z'_h - z_h) W_O^h, J the norm's Jacobian at the run's combined output (the first-order term of
    forward.py's post_norm(combine(z + a (z' - z)))): its dot product is (z'_h - z_h) W_O^h . J^T g_r, with J^T g_r
    taken run by run (J differs between EAP-IG's steps)."""

    def __init__(self, model: Transformer, examples: int | None = None):
        """examples: None sums over every example; a number keeps one sum per example (B of them; `add` and
        `contract` then say which examples the pass holds), the same products taken example by example."""
        self.model, self.graph = model, Graph.of(model)
        graph = self.graph
        shape = (len(graph.receivers), len(graph.senders))
        self.per_example = examples is not None
        self.sums_RS = torch.zeros((examples, *shape) if self.per_example else shape, dtype=torch.float64)
        self.examples = slice(None)
        # receiver groups in receiver order: (first row, what they are, the senders they read)
        self.groups: list[tuple[int, tuple[str, int], int]] = []
        row = 0
        for layer in range(graph.n_layers):
            receivers = graph.layer_receivers(layer)
            if graph.heads_per_layer[layer]:
                self.groups.append((row, ("heads", layer), graph.sender_start(layer)))
            if graph.mlp:
                self.groups.append((row + len(receivers) - 1, ("mlp", layer), graph.n_senders(receivers[-1])))
            row += len(receivers)
        self.groups.append((row, ("logits", -1), len(graph.senders)))
        self.pending: list[Tensor | None] = [None] * len(self.groups)  # per group, the gradients summed over runs

    @torch.no_grad()
    def add(self, grads: ReceiverGradients, delta: NodeOutputs) -> None:
        """Take the N runs of `grads` (N*B rows) of the B examples of the sender deltas `delta`: their products through
        a post-norm now, their gradients summed into those `contract` multiplies."""
        _, post_norm_heads = sender_rows(self.model, delta)
        n = len(grads.logits) // len(delta.emb)
        for i, (row, group, n_senders) in enumerate(self.groups):
            grads_XNK = group_grads(grads, group, n)
            summed_XK = grads_XNK[:, 0] if n == 1 else grads_XNK.sum(1)
            self.pending[i] = summed_XK if self.pending[i] is None else self.pending[i] + summed_XK
            for layer, heads_HK in post_norm_heads.items():
                start = self.graph.sender_start(layer)
                if n_senders <= start:  # the group does not read this layer's heads
                    continue
                combined_RTC = grads.combined[layer]
                through_XRTC = through_norm(
                    self.model.blocks[layer], combined_RTC, grads_XNK.reshape(-1, *combined_RTC.shape)
                )
                product_XH = self.product(through_XRTC.view(grads_XNK.shape).sum(1), heads_HK)
                self.sums_RS[..., row : row + len(grads_XNK), start : start + len(heads_HK)] += product_XH

    @torch.no_grad()
    def contract(self, delta: NodeOutputs) -> None:
        """Add the products of the gradients summed since the last call with the senders' deltas `delta`."""
        senders_SK, _ = sender_rows(self.model, delta)
        for i, (row, _, n_senders) in enumerate(self.groups):
            product_XS = self.product(self.pending[i], senders_SK[:n_senders])
            self.sums_RS[..., row : row + product_XS.shape[-2], :n_senders] += product_XS
        self.pending = [None] * len(self.groups)

    def product(self, grads_XK: Tensor, senders_SK: Tensor) -> Tensor:
        """(X, S) float64 on the CPU: grads . senders over K = B*T*C; per example, (B, X, S) at the pass's examples'
        rows of the sums (self.examples), each over its own T*C."""
        if not self.per_example:
            return (grads_XK @ senders_SK.T).double().cpu()
        B = len(range(self.sums_RS.shape[0])[self.examples])
        grads_XBK, senders_SBK = grads_XK.view(len(grads_XK), B, -1), senders_SK.view(len(senders_SK), B, -1)
        full_BXS = torch.einsum("xbk,sbk->bxs", grads_XBK, senders_SBK).double().cpu()
        at = torch.zeros(self.sums_RS.shape[0], *full_BXS.shape[1:], dtype=torch.float64)
        at[self.examples] = full_BXS
        return at

    def edges(self) -> Tensor:
        """(E,) float64 in Graph.edges' order (by receiver, then sender); per example (B, E)."""
        reads_R = torch.tensor([self.graph.n_senders(r) for r in self.graph.receivers])
        return self.sums_RS[..., torch.arange(len(self.graph.senders))[None] < reads_R[:, None]]


def sender_rows(model: Transformer, delta: NodeOutputs) -> tuple[Tensor, dict[int, Tensor]]:
    """(S, B*T*C): each sender's out' - out as it enters the stream, in the sender order, a head's (z'_h - z_h) W_O^h;
    heads whose layer has a post-norm are zero there and given apart, (H, B*T*C) per such layer."""
    rows, post_norm_heads = [delta.emb[None]], {}
    for layer, block in enumerate(model.blocks):
        heads_HBTC = block.head_terms(delta.z[layer], "hbtc")
        if block.attention_post_norm:
            post_norm_heads[layer] = heads_HBTC.flatten(1)
            heads_HBTC = torch.zeros_like(heads_HBTC)
        rows.append(heads_HBTC)
        if block.mlp is not None:
            rows.append(delta.mlp[layer][None])
    return torch.cat(rows).flatten(1), post_norm_heads


def group_grads(grads: ReceiverGradients, group: tuple[str, int], n: int) -> Tensor:
    """(X, N, B*T*C): the gradients of a group's X receiver inputs (a layer's heads' q, k, v in receiver
    order; an MLP's; the logits') in each of the N runs."""
    kind, layer = group
    if kind == "heads":
        heads_HWRTC = grads.heads[layer]
        return heads_HWRTC.reshape(heads_HWRTC.shape[0] * 3, n, -1)  # a copy where autograd left it permuted
    return (grads.mlp[layer] if kind == "mlp" else grads.logits).view(1, n, -1)


def through_norm(block: Block, at_RTC: Tensor, grads_XRTC: Tensor) -> Tensor:
    """(X, rows, T, C): J^T g for each of the X gradients g, J the Jacobian of the block's attention post-norm at `at`
    (row by row; Block.attention_post_norm_vjp)."""
    return block.attention_post_norm_vjp(at_RTC, grads_XRTC)


def ranking_agreement(estimate: Tensor, exact: Tensor, k: int) -> dict[str, float]:
    """How well estimated edge scores rank edges as the exact scores do, by |score|: Spearman's rank correlation
    (average ranks for ties) and the top-k recall, the share of the exact top k that the estimate's top k holds."""
    if not 1 <= k <= len(exact):
        raise ConfigError("edge_attribution.verify_top_k", k, f"must lie in 1..{len(exact)} (the edges scored)")
    ranks = [pd.Series(s.abs().double().cpu().numpy()).rank() for s in (estimate, exact)]
    top = [set(s.abs().argsort(descending=True)[:k].tolist()) for s in (estimate, exact)]
    return {"spearman": float(ranks[0].corr(ranks[1])), "top_k_recall": len(top[0] & top[1]) / k}

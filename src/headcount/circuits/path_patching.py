"""Path patching (Wang et al. 2022): the effect on the metric of sending a sender set's corrupted output along the
direct path into a receiver set only.

Given a clean run and a corrupted run of the same prompts, for senders S and receiver inputs R (heads' .q/.k/.v,
MLPs, the logits):

- frozen: every node not a receiver keeps its clean output as far as the receivers are concerned: receiver r's
  input is the clean stream into r with, for each sender s in S, s's clean output replaced by its corrupted one,
  x_r = sum_{senders t of r} (corrupted output if t in S, else clean output), attention mixed per head before the
  layer's post-norm exactly as in the edge-patched forward (forward.py);
- recomputes: each receiver from that patched input (a head's q, k or v only: its other inputs stay clean), and
  everything downstream of the receivers normally, from the receivers' new outputs; a receiver's own patched input
  stays fixed even when an earlier receiver changed the stream before it (Wang et al.'s step 3 patches the inputs
  recorded in step 2, where every non-sender was frozen).

Nothing before the first receiver's layer changes, so the pass starts there from the clean stream (prefix reuse),
and P (sender set, receiver set) pairs of B examples run as P * B rows, in passes of some pairs of some examples
sized to a memory budget (passes.py). A pair costs about the model's forward from that layer on: its receivers'
inputs are the clean streams into them plus one change (patched_inputs), and each layer runs as the model runs it,
only its receiver heads again from their own inputs (run_with_inputs: the model's forward with an intervention at the
receivers' sites). For one sender and one receiver, or receivers
all in one layer, path patching equals the edge-patched forward with the edges S x R removed.
Where every sender's corrupted output equals its clean one up to position p_b (IOI's prompts agree up to S2), nothing
before p_b changes, and positions after the last score point cannot reach one: the run from the receivers on takes
only the positions between, over the clean keys and values before them (model/suffix.py's SuffixRun).
The result is the effect, metric(patched) - metric(clean), per pair (float64, summed over the points).
"""

from collections.abc import Callable

import torch
from torch import Tensor

from headcount.circuits.attribution import example_chunks, logits_at, outputs_at
from headcount.circuits.forward import (
    NodeOutputs,
    attention_contribution,
    node_outputs,
    plain_streams,
)
from headcount.circuits.forward import receiver_inputs as stream_into
from headcount.circuits.graph import Graph, Node, Receiver
from headcount.circuits.metric import Metric, metric_at, point_values, points_mask
from headcount.circuits.passes import budget_of, path_example_bytes, path_unit_bytes, plan_passes
from headcount.errors import ConfigError
from headcount.model.intervention import Hook, Intervention, keep
from headcount.model.sites import Site
from headcount.model.suffix import SuffixRun, first_difference, layout_of
from headcount.model.transformer import Transformer

HeadsFromInputs = Callable[[Tensor, Tensor], Tensor]  # (x (R, K, 3, T, C), heads (K,)) -> z (R, T, K, D)


def path_patch(
    model: Transformer,
    clean_ids_BT: Tensor,
    corrupted_ids_BT: Tensor | NodeOutputs,
    pairs: list[tuple[list[str], list[str]]],
    metric: Metric,
    score_positions_B: Tensor | None = None,
    pairs_per_pass: int | None = None,
    memory_budget: int | None = None,
    per_example: bool = False,
) -> Tensor:
    """(P,) float64 effects of the P (sender names, receiver input names) pairs, e.g. (["L0H1"], ["L1H0.k"]), in
    passes of pairs_per_pass pairs (None: as many as fit) of as many examples as fit memory_budget bytes (None: the
    default budget, passes.py); per_example: (B, P), each example's points summed apart (their sum over examples is
    the effects), which a scan over several processes gathers and the bootstrap resamples."""
    graph = Graph.of(model)
    resolved = [_resolve(graph, senders, receivers) for senders, receivers in pairs]
    points_BT = points_mask(clean_ids_BT, score_positions_B)
    B, T = points_BT.shape
    points = int(points_BT.sum(1).max()) if B else 0
    unit = path_unit_bytes(model, T, points, max((len(r) for _, r in resolved), default=0))
    plan = plan_passes(
        unit, path_example_bytes(model, T), len(pairs), B, budget_of(model, memory_budget), pairs_per_pass
    )
    patched_NP = torch.empty(len(pairs), int(points_BT.sum()), dtype=torch.float64)
    clean_P = torch.empty(patched_NP.shape[1], dtype=torch.float64)
    with torch.no_grad():
        for examples, columns in example_chunks(plan, points_BT):
            clean = node_outputs(model, clean_ids_BT[examples])
            corrupted = outputs_at(model, corrupted_ids_BT, examples)
            at_points, chunk_metric = points_BT[examples], metric_at(metric, columns)
            clean_stream = stream_into(model, graph, clean, None, None, len(graph.senders))[:, 0]
            clean_P[columns] = point_values(logits_at(model, clean_stream, at_points), chunk_metric)[0]
            suffix = suffix_run(model, graph, clean, corrupted, at_points)
            for rows in plan.row_chunks(len(pairs)):
                chunk = resolved[rows]
                patched = patched_inputs(model, graph, clean, corrupted, chunk)
                final = run_with_inputs(model, graph, clean, patched, len(chunk), suffix)
                logits = logits_at(model, final, at_points)
                patched_NP[rows, columns] = point_values(logits, chunk_metric)
    if not per_example:
        return patched_NP.sum(1) - clean_P.sum()
    prompt_P = points_BT.nonzero()[:, 0].cpu()
    sums_BN = torch.zeros(B, len(pairs) + 1, dtype=torch.float64)
    sums_BN.index_add_(0, prompt_P, torch.cat([clean_P[:, None], patched_NP.T], dim=1))
    return sums_BN[:, 1:] - sums_BN[:, :1]


def suffix_run(
    model: Transformer, graph: Graph, clean: NodeOutputs, corrupted: NodeOutputs, points_BT: Tensor
) -> SuffixRun | None:
    """The positions a pair's run takes: from the first at which any sender's corrupted output differs from its
    clean one to the last score point (None: all of them). Only under causal attention: an encoder's every position
    reads every other, so it runs them all."""
    if not model.cfg.causal:
        return None
    runs = [clean.emb, *clean.z, *clean.mlp], [corrupted.emb, *corrupted.z, *corrupted.mlp]
    layout = layout_of(first_difference(*runs), points_BT)
    if layout is None:
        return None
    count = lambda layer: graph.sender_start(layer)  # noqa: E731  (the senders the stream into a layer holds)
    return SuffixRun(
        list(model.blocks), layout, lambda layer: plain_streams(model, graph, clean, {count(layer)})[count(layer)]
    )


def _resolve(graph: Graph, senders: list[str], receivers: list[str]) -> tuple[list[Node], list[Receiver]]:
    s_nodes = [graph.node(s, "path_patching.senders") for s in senders]
    r_inputs = [graph.receiver(r, "path_patching.receivers") for r in receivers]
    if not s_nodes or not r_inputs:
        raise ConfigError("path_patching.pairs", (senders, receivers), "each pair needs a sender and a receiver")
    for s in s_nodes:
        if s.kind == "logits":
            raise ConfigError("path_patching.senders", s.name, "senders are emb, heads and MLPs")
        for r in r_inputs:
            if graph.senders.index(s) >= graph.n_senders(r):
                raise ConfigError("path_patching.receivers", r.name, f"must come after its sender {s.name}")
    return s_nodes, r_inputs


def patched_inputs(
    model: Transformer, graph: Graph, clean: NodeOutputs, corrupted: NodeOutputs, pairs
) -> dict[tuple[int, Receiver], Tensor]:
    """(pair, receiver) -> the receiver's patched input (B, T, C): its clean senders with S's outputs corrupted.

    Every sender of a pair comes before each of its receivers (_resolve), so a receiver's input is the clean stream
    into it plus one change per pair, the same for all its receivers: the senders' corrupted-minus-clean outputs as
    they join the stream (sender_change). The general formula (forward.py's receiver_inputs with S's edges at weight
    1) re-adds every earlier sender per receiver; this adds one term."""
    delta = corrupted.minus(clean)
    if model.cfg.post_ln:
        return post_ln_inputs(model, graph, clean, delta, pairs)
    counts = {graph.n_senders(r) for _, receivers in pairs for r in receivers}
    clean_into = plain_streams(model, graph, clean, counts)
    clean_attention: dict[int, Tensor] = {}
    patched = {}
    for p, (senders, receivers) in enumerate(pairs):
        change_BTC = sender_change(model, graph, clean, delta, senders, clean_attention)
        for r in receivers:
            patched[p, r] = clean_into[graph.n_senders(r)] + change_BTC
    return patched


def post_ln_inputs(
    model: Transformer, graph: Graph, clean: NodeOutputs, delta: NodeOutputs, pairs
) -> dict[tuple[int, Receiver], Tensor]:
    """patched_inputs of a post-LN model (BERT): the stream is normalised after every addition, so a change does not
    add up; each receiver's input is the stream rebuilt from the clean outputs with the senders' corrupted ones, each
    addition and norm as the blocks make them (forward.py's receiver_inputs with the senders' edges at weight 1)."""
    patched = {}
    for p, (senders, receivers) in enumerate(pairs):
        chosen = [graph.senders.index(s) for s in senders]
        for r in receivers:
            w_B1S = clean.emb.new_zeros(len(clean.emb), 1, graph.n_senders(r))
            w_B1S[..., chosen] = 1.0
            patched[p, r] = stream_into(model, graph, clean, delta, w_B1S, graph.n_senders(r))[:, 0]
    return patched


def sender_change(
    model: Transformer,
    graph: Graph,
    clean: NodeOutputs,
    delta: NodeOutputs,
    senders: list[Node],
    clean_attention: dict[int, Tensor],
) -> Tensor:
    """(B, T, C): how the stream changes when the senders' outputs turn corrupted and nothing else does. emb and an
    MLP add their own change; a layer's heads add sum_h dz_h W_O^h where attention has no post-norm (linear in z), and
    otherwise post_norm(combine(z + dz on the senders' heads)) - post_norm(combine(z)) (the layer's clean
    contribution computed once per pass, in clean_attention)."""
    change_BTC = torch.zeros_like(clean.emb)
    heads: dict[int, list[int]] = {}
    for s in senders:
        if s.kind == "emb":
            change_BTC = change_BTC + delta.emb
        elif s.kind == "mlp":
            change_BTC = change_BTC + delta.mlp[s.layer]
        else:
            heads.setdefault(s.layer, []).append(s.head)
    for layer, chosen in heads.items():
        block = model.blocks[layer]
        if not block.attention_post_norm:
            change_BTC = change_BTC + block.head_terms_of(delta.z[layer][:, :, chosen], chosen)
            continue
        w_11H = torch.zeros(1, 1, graph.heads_per_layer[layer], dtype=clean.emb.dtype, device=clean.emb.device)
        w_11H[..., chosen] = 1.0
        if layer not in clean_attention:
            clean_attention[layer] = attention_contribution(block, clean.z[layer], None, None)[:, 0]
        patched_BTC = attention_contribution(block, clean.z[layer], delta.z[layer], w_11H.expand(len(clean.emb), 1, -1))
        change_BTC = change_BTC + (patched_BTC[:, 0] - clean_attention[layer])
    return change_BTC


def run_with_inputs(
    model: Transformer,
    graph: Graph,
    clean: NodeOutputs,
    patched: dict[tuple[int, Receiver], Tensor],
    n_pairs: int,
    suffix: SuffixRun | None = None,
) -> Tensor:
    """The logits' input (n_pairs * B, T, C) of the model run with the receivers' inputs replaced, pair p in rows
    p*B.. (the unembedding is the caller's, at its score points): the model's own forward from the first receiver's
    layer, with an intervention at the receivers' layers. A receiver head's z is recomputed from its patched input
    (its other two inputs the stream into its layer, read at resid_pre) by the model's heads_from_inputs and replaces
    the plain z at attn.z; a receiver MLP's rows of mlp.input (what the MLP alone reads) are its patched input.
    suffix: the same forward at its positions only (T reads S until the end), the others clean."""
    B = clean.emb.shape[0]
    start = min(r.node.layer for _, r in patched)
    stream = plain_streams(model, graph, clean, {graph.sender_start(start)})[graph.sender_start(start)]
    if suffix is not None:
        stream, patched = suffix.gather(stream), {key: suffix.gather(x) for key, x in patched.items()}
    hooks: list[tuple[Site, Hook]] = []
    for layer in range(start, graph.n_layers):
        head_inputs = {(p, r): x for (p, r), x in patched.items() if r.node.kind == "head" and r.node.layer == layer}
        if head_inputs:
            from_inputs = model.blocks[layer].heads_from_inputs if suffix is None else suffix.heads_from_inputs(layer)
            hooks.extend(receiver_heads(layer, from_inputs, head_inputs, B))
        mlp_inputs = {p: x for (p, r), x in patched.items() if r.node == Node("mlp", layer)}
        if mlp_inputs:
            hooks.append((Site("mlp.input", layer), lambda x, site, rows=mlp_inputs: _rows(x, rows, B)))
    intervention = Intervention(hooks)
    if suffix is None:
        final = model.forward_layers(stream.repeat(n_pairs, 1, 1), start, intervention)
        return _replace(final, patched, Node("logits", graph.n_layers), B)
    final = suffix.forward_layers(stream.repeat(n_pairs, 1, 1), start, intervention)
    return suffix.scatter(_replace(final, patched, Node("logits", graph.n_layers), B), graph.n_layers)


def receiver_heads(
    layer: int, from_inputs: HeadsFromInputs, head_inputs: dict[tuple[int, Receiver], Tensor], B: int
) -> list[tuple[Site, Hook]]:
    """Hooks that keep the stream into the layer (resid_pre) and put the receiver heads' z, each from its patched
    input and the stream for its other two (from_inputs: the block's heads_from_inputs, or a SuffixRun's at its
    positions), in place of theirs (attn.z)."""
    into: dict[str, Tensor] = {}
    heads = sorted({r.node.head for _, r in head_inputs})

    def recompute(z_RTHD: Tensor, site: Site) -> Tensor:
        stream = into[Site("resid_pre", layer).name]
        x_RKWTC = stream[:, None, None].repeat(1, len(heads), 3, 1, 1)
        for (p, r), x in head_inputs.items():
            x_RKWTC[p * B : (p + 1) * B, heads.index(r.node.head), "qkv".index(r.input)] = x
        index_K = torch.tensor(heads, device=stream.device)
        return z_RTHD.index_copy(2, index_K, from_inputs(x_RKWTC, index_K))

    return [(Site("resid_pre", layer), keep(into)), (Site("attn.z", layer), recompute)]


def _rows(x_RTC: Tensor, rows: dict[int, Tensor], B: int) -> Tensor:
    """x with pair p's rows replaced by rows[p]."""
    x_RTC = x_RTC.clone()
    for p, x in rows.items():
        x_RTC[p * B : (p + 1) * B] = x
    return x_RTC


def _replace(x_RTC: Tensor, patched: dict[tuple[int, Receiver], Tensor], node: Node, B: int) -> Tensor:
    """x with the rows of the pairs that patch this node's (single) input replaced."""
    chosen = {p: x for (p, r), x in patched.items() if r.node == node}
    if not chosen:
        return x_RTC
    x_RTC = x_RTC.clone()
    for p, x in chosen.items():
        x_RTC[p * B : (p + 1) * B] = x
    return x_RTC

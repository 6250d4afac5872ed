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
and P (sender set, receiver set) pairs run as one batch of P * B rows. For one sender and one receiver, or receivers
all in one layer, path patching equals the edge-patched forward with the edges S x R removed.
The result is the effect, metric(patched) - metric(clean), per pair (float64, summed over the points).
"""

import torch
from torch import Tensor

from headcount.circuits.forward import (
    NodeOutputs,
    attention_contribution,
    heads_from_inputs,
    node_outputs,
    outputs_of,
)
from headcount.circuits.forward import receiver_inputs as stream_into
from headcount.circuits.graph import Graph, Node, Receiver
from headcount.circuits.metric import Metric, last_positions, metric_sums
from headcount.errors import ConfigError
from headcount.model.transformer import Transformer


def path_patch(
    model: Transformer,
    clean_ids_BT: Tensor,
    corrupted_ids_BT: Tensor | NodeOutputs,
    pairs: list[tuple[list[str], list[str]]],
    metric: Metric,
    score_positions_B: Tensor | None = None,
    pairs_per_pass: int = 64,
) -> Tensor:
    """(P,) float64 effects of the P (sender names, receiver input names) pairs, e.g. (["L0H1"], ["L1H0.k"]), in
    passes of pairs_per_pass pairs."""
    graph = Graph.of(model)
    positions = last_positions(clean_ids_BT) if score_positions_B is None else score_positions_B
    clean, corrupted = node_outputs(model, clean_ids_BT), outputs_of(model, corrupted_ids_BT)
    resolved = [_resolve(graph, senders, receivers) for senders, receivers in pairs]
    sums = []
    with torch.no_grad():
        clean_sum = metric_sums(model(clean_ids_BT), positions, metric)
        for start in range(0, len(resolved), pairs_per_pass):
            chunk = resolved[start : start + pairs_per_pass]
            patched = patched_inputs(model, graph, clean, corrupted, chunk)
            sums.append(metric_sums(run_with_inputs(model, graph, clean, patched, len(chunk)), positions, metric))
    return torch.cat(sums) - clean_sum


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
    """(pair, receiver) -> the receiver's patched input (B, T, C): its clean senders with S's outputs corrupted."""
    delta = corrupted.minus(clean)
    patched = {}
    for p, (senders, receivers) in enumerate(pairs):
        for r in receivers:
            n = graph.n_senders(r)
            w_S = torch.zeros(n, dtype=clean.emb.dtype, device=clean.emb.device)
            w_S[[graph.senders.index(s) for s in senders]] = 1.0
            w_BXS = w_S.expand(clean.emb.shape[0], 1, n)
            patched[p, r] = stream_into(model, graph, clean, delta, w_BXS, n)[:, 0]
    return patched


def run_with_inputs(
    model: Transformer, graph: Graph, clean: NodeOutputs, patched: dict[tuple[int, Receiver], Tensor], n_pairs: int
) -> Tensor:
    """Logits (n_pairs * B, T, V) of the model run with the receivers' inputs replaced, pair p in rows p*B.."""
    B = clean.emb.shape[0]
    layers = [r.node.layer for _, r in patched]
    start = min(layers)
    if start < graph.n_layers:
        start_senders = graph.sender_start(start)
        stream = stream_into(model, graph, clean, None, None, start_senders)[:, 0].repeat(n_pairs, 1, 1)
    for layer in range(start, graph.n_layers):
        block = model.blocks[layer]
        head_inputs = {(p, r): x for (p, r), x in patched.items() if r.node.kind == "head" and r.node.layer == layer}
        if head_inputs:
            n_heads = graph.heads_per_layer[layer]
            x_RHWTC = stream[:, None, None].repeat(1, n_heads, 3, 1, 1)
            for (p, r), x in head_inputs.items():
                x_RHWTC[p * B : (p + 1) * B, r.node.head, "qkv".index(r.input)] = x
            z_RTHD = heads_from_inputs(block, x_RHWTC)
        else:
            z_RTHD = block.attn.heads(block.ln_attn(stream))
        attn = attention_contribution(block, z_RTHD, None, None)[:, 0]
        if block.mlp is None:
            stream = stream + attn
            continue
        mlp_in = stream if block.parallel_residual else stream + attn
        mlp_in = _replace(mlp_in, patched, Node("mlp", layer), B)
        stream = stream + attn + block.drop(block.mlp_out(mlp_in))
    if start == graph.n_layers:
        stream = stream_into(model, graph, clean, None, None, len(graph.senders))[:, 0].repeat(n_pairs, 1, 1)
    return model.unembed(_replace(stream, patched, Node("logits", graph.n_layers), B))


def _replace(x_RTC: Tensor, patched: dict[tuple[int, Receiver], Tensor], node: Node, B: int) -> Tensor:
    """x with the rows of the pairs that patch this node's (single) input replaced."""
    chosen = {p: x for (p, r), x in patched.items() if r.node == node}
    if not chosen:
        return x_RTC
    x_RTC = x_RTC.clone()
    for p, x in chosen.items():
        x_RTC[p * B : (p + 1) * B] = x
    return x_RTC

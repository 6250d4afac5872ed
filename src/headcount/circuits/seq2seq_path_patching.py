"""Path patching through cross-attention (Wang et al. 2022's definition, path_patching.py's, on seq2seq_graph.py's
graph): for senders S and receiver inputs R, each receiver's input is its clean input with the outputs of S replaced
by their corrupted ones (out_clean + (out' - out_clean) on the edges S -> r, every other sender at its clean output,
through the encoder's final norm for a cross head's .k and .v, through the blocks' norms where post-LN); the receivers
recompute from those inputs and everything downstream recomputes normally, a receiver's input held at that value
even when an earlier receiver changed the stream. The effect is M(patched) - M(clean), teacher forced. It is the
edge-patched forward with weight 1 on the edges S -> R and those receivers held at the clean run's outputs
(seq2seq_forward.seq2seq_stream's held_NR); for one edge, its exact score. Receivers are the decoder's and cross
heads' inputs, the decoder's MLPs and the logits: path patching into the encoder's own receivers is refused (the
encoder runs forward.py's one-stack forward, which holds no receiver at the clean run).
"""

import torch
from torch import Tensor

from headcount.circuits.metric import Metric
from headcount.circuits.seq2seq_attribution import Corrupted, seq2seq_edge_metric
from headcount.circuits.seq2seq_graph import Seq2SeqGraph
from headcount.errors import ConfigError
from headcount.labels import edge_label
from headcount.model.encoder_decoder import EncoderDecoder


def seq2seq_path_patch(
    model: EncoderDecoder,
    src_BS: Tensor,
    tgt_BT: Tensor,
    corrupted: Corrupted,
    pairs: list[tuple[list[str], list[str]]],
    metric: Metric,
    points_BT: Tensor | None = None,
    rows_per_pass: int = 16,
    examples_per_pass: int | None = None,
) -> Tensor:
    """(P,) float64: each (senders, receiver inputs) pair's effect M(patched) - M(clean), summed over the points;
    senders named as the graph names them (enc.L0H1, cross.L1H0, dec.L0.mlp, enc.emb), receivers by their input
    (cross.L1H0.k, dec.L1H0.q, dec.L1.mlp, logits)."""
    graph = Seq2SeqGraph.of(model)
    dtype = model.decoder.tok_emb.weight.dtype
    weights_NE = torch.zeros(len(pairs) + 1, len(graph.edges), dtype=dtype)
    held_NR = torch.zeros(len(pairs) + 1, len(graph.receivers), dtype=torch.bool)
    receiver_at = {r: i for i, r in enumerate(graph.receivers)}
    for row, (senders, receivers) in enumerate(pairs, start=1):
        nodes = [graph.node(name) for name in senders]
        for name in receivers:
            receiver = graph.receiver(name)
            if receiver.node.stack == "enc":
                raise ConfigError(
                    "circuits.receivers",
                    name,
                    "path patching into an encoder's own receivers is not defined through an encoder-decoder yet: "
                    "receivers are cross.LlHh.q|k|v, dec.LlHh.q|k|v, dec.Ll.mlp and logits",
                )
            edges = [edge_label(node.name, receiver.name) for node in nodes]
            index = [graph.edge_index[e] for e in edges if e in graph.edge_index]
            if not index:
                raise ConfigError("circuits.receivers", name, f"reads none of the senders {', '.join(senders)}")
            weights_NE[row, index] = 1
            held_NR[row, receiver_at[receiver]] = True
    args = (weights_NE, metric, points_BT, rows_per_pass, held_NR, examples_per_pass)
    values = seq2seq_edge_metric(model, src_BS, tgt_BT, corrupted, *args)
    return values[1:] - values[0]

"""Circuit analysis: how heads connect. Nodes and edges (graph.py), the exact edge-patched forward (forward.py), path
patching (path_patching.py), edge attribution: exact, EAP and EAP-IG (attribution.py; gradients.py: the receiver
gradients EAP reads from one backward), circuits and their faithfulness (faithfulness.py), MIB's CPR and CMD of a
ranking (cpr.py) and a circuit's picture (figure.py), every evaluation in passes of some rows of some examples sized
to a memory budget (passes.py).
docs/DESIGN.md, "Circuits: nodes, edges, path patching", has the definitions. Imports only headcount.model,
headcount.config and headcount.errors, so scans can wrap it; every function takes (model, clean ids, corrupted ids,
..., metric, score positions). For example:

    metric = lambda logits_BV: logits_BV[:, io_token] - logits_BV[:, s_token]  # per point; summed in float64
    # each prompt's own answers (io_B, s_B): a PointMetric, which every pass hands its points' rows
    logit_diff = lambda logits, io, s: (logits.gather(1, io[:, None]) - logits.gather(1, s[:, None]))[:, 0]
    metric = PointMetric(logit_diff, io_B, s_B)
    eap = eap_scores(model, clean_ids, corrupted_ids, metric)  # one score per Graph.of(model).edges
    exact = exact_edge_scores(model, clean_ids, corrupted_ids, metric, edges=eap.abs().argsort()[-20:].tolist())
    effect = path_patch(model, clean_ids, corrupted_ids, [(["L0H1"], ["L1H0.k"])], metric)
    circuit = top_edges(Graph.of(model), eap, 50)
    faithfulness(model, clean_ids, corrupted_ids, [circuit], metric)
    points, areas = circuit_performance(model, clean_ids, corrupted_ids, {"eap": eap}, metric)  # MIB's CPR, CMD
    save_circuit(Graph.of(model), circuit, "circuit.png", eap)

An encoder-decoder's edges (cross-attention's keys and values reading the encoder) are Seq2SeqGraph's, scored teacher
forced by seq2seq_exact_edge_scores, seq2seq_eap_scores and seq2seq_eap_ig_scores, patched by seq2seq_path_patch and
kept by seq2seq_faithfulness (seq2seq_*.py).
"""

from headcount.circuits.attribution import (
    eap_ig_scores,
    eap_scores,
    edge_metric,
    exact_edge_scores,
    ranking_agreement,
)
from headcount.circuits.cpr import MIB_FRACTIONS, circuit_performance, curve_areas, mib_sizes
from headcount.circuits.faithfulness import faithfulness, faithfulness_curve, prune, top_edges
from headcount.circuits.figure import draw_circuit, save_circuit
from headcount.circuits.forward import NodeOutputs, edge_forward, node_outputs, outputs_of
from headcount.circuits.graph import Edge, Graph, Node, Receiver
from headcount.circuits.metric import PointMetric
from headcount.circuits.passes import PassPlan
from headcount.circuits.path_patching import path_patch
from headcount.circuits.seq2seq_attribution import (
    seq2seq_eap_ig_scores,
    seq2seq_eap_scores,
    seq2seq_edge_metric,
    seq2seq_exact_edge_scores,
    seq2seq_faithfulness,
)
from headcount.circuits.seq2seq_forward import Seq2SeqOutputs, seq2seq_edge_logits, seq2seq_outputs
from headcount.circuits.seq2seq_graph import Seq2SeqGraph
from headcount.circuits.seq2seq_path_patching import seq2seq_path_patch

__all__ = [
    "MIB_FRACTIONS",
    "Edge",
    "Graph",
    "Node",
    "NodeOutputs",
    "PassPlan",
    "PointMetric",
    "Receiver",
    "Seq2SeqGraph",
    "Seq2SeqOutputs",
    "circuit_performance",
    "curve_areas",
    "draw_circuit",
    "eap_ig_scores",
    "eap_scores",
    "edge_forward",
    "edge_metric",
    "exact_edge_scores",
    "faithfulness",
    "faithfulness_curve",
    "mib_sizes",
    "node_outputs",
    "outputs_of",
    "path_patch",
    "prune",
    "ranking_agreement",
    "save_circuit",
    "seq2seq_eap_ig_scores",
    "seq2seq_eap_scores",
    "seq2seq_edge_logits",
    "seq2seq_edge_metric",
    "seq2seq_exact_edge_scores",
    "seq2seq_faithfulness",
    "seq2seq_outputs",
    "seq2seq_path_patch",
    "top_edges",
]

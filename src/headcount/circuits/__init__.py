"""Circuit analysis: how heads connect. Nodes and edges (graph.py), the exact edge-patched forward (forward.py), path
patching (path_patching.py), edge attribution: exact, EAP and EAP-IG (attribution.py), circuits and their
faithfulness (faithfulness.py) and a circuit's picture (figure.py). docs/DESIGN.md, "Circuits: nodes, edges, path
patching", has the definitions. Imports only headcount.model, headcount.config and headcount.errors, so scans can
wrap it; every function takes (model, clean ids, corrupted ids, ..., metric, score positions)."""

from headcount.circuits.attribution import eap_ig_scores, eap_scores, edge_metric, exact_edge_scores
from headcount.circuits.faithfulness import faithfulness, faithfulness_curve, prune, top_edges
from headcount.circuits.figure import draw_circuit, save_circuit
from headcount.circuits.forward import NodeOutputs, edge_forward, node_outputs
from headcount.circuits.graph import Edge, Graph, Node, Receiver
from headcount.circuits.path_patching import path_patch

__all__ = [
    "Edge",
    "Graph",
    "Node",
    "NodeOutputs",
    "Receiver",
    "draw_circuit",
    "eap_ig_scores",
    "eap_scores",
    "edge_forward",
    "edge_metric",
    "exact_edge_scores",
    "faithfulness",
    "faithfulness_curve",
    "node_outputs",
    "path_patch",
    "prune",
    "save_circuit",
    "top_edges",
]

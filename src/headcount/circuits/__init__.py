"""Circuit analysis: how heads connect. Nodes and edges (graph.py), the exact edge-patched forward (forward.py), path
patching (path_patching.py), edge attribution EAP and EAP-IG (attribution.py), circuits and their faithfulness
(faithfulness.py) and a circuit's picture (figure.py). docs/DESIGN.md, "Circuits: nodes, edges, path patching", has
the definitions. Imports only headcount.model, headcount.config and headcount.errors, so scans can wrap it."""

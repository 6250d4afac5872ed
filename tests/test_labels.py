"""Head labels are built and parsed in one place (headcount/labels.py, issue 33 item 6): every other module goes
through it, a table's names are read back by the function that wrote them, and the graph, the masks and the scans
agree on a head's name."""

import re
from pathlib import Path

import pytest
import torch

from headcount.ablation.engine.masks import parsed_head, requested_masks
from headcount.circuits.graph import Graph
from headcount.config.model import ModelConfig
from headcount.errors import ConfigError
from headcount.labels import (
    MASK_SEPARATOR,
    edge_label,
    head_label,
    heads_in,
    input_label,
    join_heads,
    join_names,
    parse_head,
    receiver_head,
    split_edge,
    split_heads,
    split_input,
    split_mask,
    split_names,
)
from headcount.model.transformer import Transformer

SRC = Path(__file__).resolve().parents[1] / "src" / "headcount"
# A head label built by hand (f"L{layer}H{head}") or parsed by a pattern of its own (r"L(\d+)H(\d+)", .split("H")).
BUILT = re.compile(r'f"L\{[^}]*\}H\{')
PARSED = re.compile(r"L\(?\\d\+\)?H\(?\\d\+|\[1:\]\.split\(\"H\"\)")


def test_no_module_but_labels_builds_or_parses_a_head_label():
    offenders = [
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if path.name != "labels.py" and (BUILT.search(path.read_text()) or PARSED.search(path.read_text()))
    ]
    assert offenders == []


def test_the_check_sees_a_label_built_by_hand():
    assert BUILT.search('name = f"L{layer}H{head}"') and PARSED.search(r'HEAD = re.compile(r"L(\d+)H(\d+)")')


def test_labels_round_trip():
    assert head_label(1, 3) == "L1H3" and parse_head("L1H3") == (1, 3) and parse_head(" L12H0 ") == (12, 0)
    assert parse_head("L1H3.q") is None and parse_head("L0.mlp") is None and parse_head("emb") is None
    assert input_label(2, 0, "k") == "L2H0.k" and input_label(2, 0) == "L2H0"
    assert split_input("L2H0.k") == ((2, 0), "k") and split_input("L2H0") is None and split_input("L2.mlp") is None
    assert heads_in("L0H1+L10H2") == [(0, 1), (10, 2)]
    cell = join_names(["L1H0.q", "L1H1.k", "logits"])
    assert split_names(cell) == ["L1H0.q", "L1H1.k", "logits"]


def test_the_graph_the_masks_and_the_labels_agree_on_every_head():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_layers=2, d_model=16, vocab_size=16, n_ctx=8))
    graph = Graph.of(model)
    heads = [(layer, head) for layer, n in enumerate(model.heads_per_layer) for head in range(n)]
    for layer, head in heads:
        node = graph.node(head_label(layer, head))
        assert (node.layer, node.head) == (layer, head) and node.name == head_label(layer, head)
        assert parsed_head(node.name, "k") == (layer, head)
        assert graph.receiver(input_label(layer, head, "v")).name == f"{node.name}.v"
    masks = requested_masks({"pair": "L0H1+L1H0"}, model.heads_per_layer)
    assert masks[0].heads_off == ((0, 1), (1, 0))
    with pytest.raises(ConfigError, match="suffix must be .q, .k or .v, not .x"):
        graph.receiver("L1H0.x")


# An edge label built or split by hand (f"{s} -> {r}", .split("->")), a table cell of heads split by hand.
EDGE_BUILT = re.compile(r'f"\{[^}]*\} -> \{[^}]*\}"')
EDGE_OR_CELL_SPLIT = re.compile(r'split\("->"\)|\["kept"\]\)\.split\(\)|\.str\.split\("\."\)')


def test_edges_and_cells_of_heads_are_built_and_split_in_labels_alone():
    """graph.py built and split edge labels, path_patching's figure built them again, head_circuit and ioi_circuit
    split the kept heads' cell with str.split and the induction finding a receiver label with .str.split(".")."""
    offenders = [
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if path.name != "labels.py" and (EDGE_BUILT.search(text := path.read_text()) or EDGE_OR_CELL_SPLIT.search(text))
    ]
    assert offenders == []
    assert EDGE_BUILT.search('f"{row.sender} -> {receiver}"') and EDGE_OR_CELL_SPLIT.search('str(row["kept"]).split()')
    assert edge_label("L0H1", "L1H0.k") == "L0H1 -> L1H0.k" and split_edge(" L0H1 ->L1H0.k ") == ("L0H1", "L1H0.k")
    assert split_edge("L0H1 L1H0.k") is None and split_edge("a -> b -> c") is None
    assert split_heads(join_heads([(0, 1), (1, 2)])) == ["L0H1", "L1H2"]
    assert split_mask(join_heads([(0, 1), (1, 2)], MASK_SEPARATOR)) == ["L0H1", "L1H2"]
    assert receiver_head("L1H3.q") == "L1H3" and receiver_head("L0.mlp") is None and receiver_head("logits") is None

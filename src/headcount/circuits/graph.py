"""The computational graph of a headcount Transformer as circuit analysis sees it: nodes, receiver inputs, edges.

Nodes: the embeddings (`emb`: token embeddings, scaled as the model scales them, plus learned positions), every query
head (`L3H1`), every MLP (`L2.mlp`, absent in attention-only models) and the logits (`logits`). A node that writes into
the residual stream is a *sender*; a node that reads it is a *receiver* through one or more *inputs*: a head reads
three, its query, key and value (`L3H1.q`, `.k`, `.v`, each through its layer's input norm), an MLP and the logits one
each. An edge runs from a sender to the input of a later receiver (`L3H1 -> L5H0.q`, `emb -> L0H2.v`,
`L2.mlp -> logits`); which senders come earlier follows the block's wiring:

- a head in layer l reads emb, every head and MLP of layers < l;
- a sequential block's MLP in layer l also reads layer l's heads; a parallel-residual block's (GPT-NeoX) does not;
- the logits read every sender.

Senders have one global order: emb, L0's heads, L0.mlp, L1's heads, L1.mlp, ...; every receiver's senders are a prefix
of it. Edges are ordered by receiver input (model order: a layer's heads h with q, k, v, then its MLP; the logits
last), then by sender, so the edges into one input are a contiguous block (`Graph.edge_slices`), which the
edge-patched forward (circuits/forward.py) reads as one tensor slice.
"""

import difflib
from dataclasses import dataclass
from functools import cached_property

from headcount.errors import ConfigError
from headcount.labels import edge_label, head_label, split_edge, split_input
from headcount.model.transformer import Transformer

QKV = ("q", "k", "v")


@dataclass(frozen=True)
class Node:
    """kind: "emb", "head", "mlp" or "logits"; layer (-1 for emb, n_layers for the logits); head (-1 unless a head)."""

    kind: str
    layer: int = -1
    head: int = -1

    @property
    def name(self) -> str:
        if self.kind == "head":
            return head_label(self.layer, self.head)
        return f"L{self.layer}.mlp" if self.kind == "mlp" else self.kind


@dataclass(frozen=True)
class Receiver:
    """A receiver's input: a head's "q", "k" or "v", or the single input ("") of an MLP or the logits."""

    node: Node
    input: str = ""

    @property
    def name(self) -> str:
        return f"{self.node.name}.{self.input}" if self.input else self.node.name


@dataclass(frozen=True)
class Edge:
    sender: Node
    receiver: Receiver

    @property
    def name(self) -> str:
        return edge_label(self.sender.name, self.receiver.name)


class Graph:
    """Every node, receiver input and edge of a model with `heads_per_layer` heads per layer."""

    def __init__(self, heads_per_layer: list[int], mlp: bool, mlp_beside_heads: bool):
        """mlp_beside_heads: each MLP reads its layer's input beside the heads, not their output (a parallel-residual
        block, Block.mlp_reads_attention false)."""
        self.heads_per_layer, self.mlp, self.mlp_beside_heads = list(heads_per_layer), mlp, mlp_beside_heads
        self.n_layers = len(self.heads_per_layer)
        senders = [Node("emb")]
        for layer, n_heads in enumerate(self.heads_per_layer):
            senders += [Node("head", layer, h) for h in range(n_heads)]
            senders += [Node("mlp", layer)] if mlp else []
        self.senders = senders
        self.receivers = [r for layer in range(self.n_layers) for r in self.layer_receivers(layer)]
        self.receivers.append(Receiver(Node("logits", self.n_layers)))
        self.edges = [Edge(s, r) for r in self.receivers for s in self.senders[: self.n_senders(r)]]

    @classmethod
    def of(cls, model: Transformer) -> "Graph":
        refuse_cross_attention(model)
        beside = any(not block.mlp_reads_attention for block in model.blocks)
        return cls(model.heads_per_layer, model.cfg.mlp, beside)

    def layer_receivers(self, layer: int) -> list[Receiver]:
        heads = [Receiver(Node("head", layer, h), w) for h in range(self.heads_per_layer[layer]) for w in QKV]
        return heads + ([Receiver(Node("mlp", layer))] if self.mlp else [])

    def sender_start(self, layer: int) -> int:
        """The position in the sender order of layer `layer`'s first head (n_senders for layer = n_layers)."""
        return 1 + sum(self.heads_per_layer[:layer]) + (layer if self.mlp else 0)

    def n_senders(self, receiver: Receiver) -> int:
        """How many senders (a prefix of the sender order) feed this input."""
        node = receiver.node
        if node.kind == "head":
            return self.sender_start(node.layer)
        if node.kind == "mlp":
            return self.sender_start(node.layer) + (0 if self.mlp_beside_heads else self.heads_per_layer[node.layer])
        return len(self.senders)

    @cached_property
    def edge_slices(self) -> dict[Receiver, slice]:
        """Each receiver input's contiguous block of edges."""
        slices, start = {}, 0
        for r in self.receivers:
            slices[r] = slice(start, start + self.n_senders(r))
            start += self.n_senders(r)
        return slices

    @cached_property
    def edge_index(self) -> dict[str, int]:
        return {e.name: i for i, e in enumerate(self.edges)}

    @cached_property
    def node_names(self) -> dict[str, Node]:
        nodes = self.senders + [Node("logits", self.n_layers)]
        return {n.name: n for n in nodes}

    @cached_property
    def receiver_names(self) -> dict[str, Receiver]:
        return {r.name: r for r in self.receivers}

    def node(self, name: str, key: str = "circuits.node") -> Node:
        """The node a name such as `L3H1`, `L2.mlp`, `emb` or `logits` names; a one-line ConfigError otherwise."""
        name = name.strip()
        if name in self.node_names:
            return self.node_names[name]
        raise ConfigError(key, name, self._not_found(name, self.node_names, "node"))

    def receiver(self, name: str, key: str = "circuits.receiver") -> Receiver:
        """The receiver input a name such as `L3H1.q`, `L2.mlp` or `logits` names."""
        name = name.strip()
        if name in self.receiver_names:
            return self.receiver_names[name]
        if name in self.node_names and self.node_names[name].kind == "head":
            raise ConfigError(key, name, f"a head is read through .q, .k or .v: {name}.q, {name}.k or {name}.v")
        head = split_input(name)
        if head and head_label(*head[0]) in self.node_names and head[1] not in QKV:
            raise ConfigError(key, name, f"a head's input suffix must be .q, .k or .v, not .{head[1]}")
        raise ConfigError(key, name, self._not_found(name, self.receiver_names, "receiver input"))

    def edge(self, name: str, key: str = "circuits.edge") -> Edge:
        """The edge `sender -> receiver` names; one-line ConfigErrors for a node that does not exist, a bad suffix
        or a receiver that does not read the sender (not after it in the block wiring)."""
        parts = split_edge(name)
        if parts is None:
            raise ConfigError(key, name, "an edge is written 'sender -> receiver', e.g. 'L0H1 -> L1H0.k'")
        sender, receiver = self.node(parts[0], key), self.receiver(parts[1], key)
        if sender.kind == "logits":
            raise ConfigError(key, name, "the logits send to nothing; senders are emb, heads and MLPs")
        edge = Edge(sender, receiver)
        if edge.name not in self.edge_index:
            raise ConfigError(
                key,
                name,
                f"{receiver.name} does not read {sender.name}: a receiver must come after its "
                "sender (a head reads earlier layers; a parallel block's MLP does not read its own layer)",
            )
        return edge

    def edges_named(self, names: list[str], key: str = "circuits.edges") -> list[int]:
        """Edge indices of names (each checked as in `edge`)."""
        return [self.edge_index[self.edge(n, key).name] for n in names]

    def _not_found(self, name: str, known: dict, what: str) -> str:
        heads = ", ".join(f"L{layer}: H0..H{n - 1}" for layer, n in enumerate(self.heads_per_layer))
        close = difflib.get_close_matches(name, list(known), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"no such {what} in this model ({self.n_layers} layers; heads {heads}){hint}"


def refuse_cross_attention(model) -> None:
    """A one-line ConfigError for a model whose heads read another stack or a position bias the graph does not
    hold: an encoder-decoder (cross-attention heads, T5's relative bias). Edges run on one stack, causal or
    bidirectional."""
    whole = not isinstance(model, Transformer)
    if whole or model.cross_heads is not None or model.rel_bias is not None:
        # the whole encoder-decoder by its layers; one of its stacks (its decoder, its encoder) by what it reads
        key, value = ("model.encoder_layers", model.cfg.encoder_layers) if whole else ("model.cross_attn", "set")
        raise ConfigError(
            key,
            value,
            "one-stack edges and circuits are not defined through cross-attention: they take decoders "
            "(model.causal=true) or encoders (model.causal=false); an encoder-decoder's edges (exact, EAP, EAP-IG, "
            "path patching, faithfulness) are headcount.circuits.seq2seq_* in Python",
        )

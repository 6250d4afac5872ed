"""The computational graph of an encoder-decoder (model/encoder_decoder.py) as circuit analysis sees it: two stacks
joined by the cross-attention heads' keys and values.

Senders, in one global order: the encoder's `enc.emb`, its heads `enc.LlHh` and MLPs `enc.Ll.mlp` layer by layer,
then the decoder's `dec.emb` and, layer by layer, its self-attention heads `dec.LlHh`, its cross-attention heads
`cross.LlHh` and its MLP `dec.Ll.mlp` (the block's order: self-attention, cross-attention, MLP). Receiver inputs:

- an encoder head's `.q`, `.k`, `.v` and an encoder MLP read the encoder's senders before them, as in a one-stack
  encoder (graph.py);
- a cross-attention head's `.k` and `.v` read every encoder sender: each has its own copy of the encoder's final
  stream, built from those senders' outputs (mixed by its own edges) and passed through the encoder's final norm;
- a decoder head's `.q`, `.k`, `.v`, a cross-attention head's `.q` (the decoder's stream) and a decoder MLP read the
  decoder's senders before them (a cross head's .q reads its layer's self-attention heads, the MLP its layer's
  self-attention and cross-attention heads); the `logits` read every decoder sender.

The decoder's stream holds no encoder sender: the encoder reaches it only through the cross heads' keys and values.
Every receiver's senders are a contiguous range of the sender order (the encoder's first n, every encoder sender, or
the decoder's first n); edges are ordered by receiver (model order: the encoder's layers, then each decoder layer's
self-attention heads' q, k, v, its cross heads' q, k, v, its MLP; the logits last), then by sender, so the edges into
one input are one slice (`edge_slices`), and the encoder's edges come first, in the order the encoder's own one-stack
graph gives them (the edge forward runs the encoder through forward.py with them).
"""

from dataclasses import dataclass
from functools import cached_property

from headcount.circuits.graph import QKV, Graph
from headcount.errors import ConfigError
from headcount.labels import edge_label, split_edge
from headcount.model.encoder_decoder import EncoderDecoder


@dataclass(frozen=True)
class S2SNode:
    """kind: "emb", "head", "mlp" or "logits"; stack: "enc", "dec" or "cross" (a cross-attention head; a decoder
    layer's MLP and the decoder's emb are "dec", the logits "dec")."""

    stack: str
    kind: str
    layer: int = -1
    head: int = -1

    @property
    def name(self) -> str:
        if self.kind == "logits":
            return "logits"
        if self.kind == "head":
            return f"{self.stack}.L{self.layer}H{self.head}"
        return f"{self.stack}.L{self.layer}.mlp" if self.kind == "mlp" else f"{self.stack}.emb"


@dataclass(frozen=True)
class S2SReceiver:
    node: S2SNode
    input: str = ""

    @property
    def name(self) -> str:
        return f"{self.node.name}.{self.input}" if self.input else self.node.name


@dataclass(frozen=True)
class S2SEdge:
    sender: S2SNode
    receiver: S2SReceiver

    @property
    def name(self) -> str:
        return edge_label(self.sender.name, self.receiver.name)


class Seq2SeqGraph:
    """Every node, receiver input and edge of an encoder-decoder (module docstring)."""

    def __init__(self, enc_heads: list[int], dec_heads: list[int], cross_heads: list[int], mlp: bool):
        self.enc_heads, self.dec_heads, self.cross_heads, self.mlp = list(enc_heads), list(dec_heads), cross_heads, mlp
        # the encoder's own one-stack graph: its receivers (less its final stream, "logits") are ours, in its order
        self.encoder = Graph(self.enc_heads, mlp, False)
        senders = [S2SNode("enc", "emb")]
        for layer, n in enumerate(self.enc_heads):
            senders += [S2SNode("enc", "head", layer, h) for h in range(n)] + (
                [S2SNode("enc", "mlp", layer)] if mlp else []
            )
        self.n_enc_senders = len(senders)
        senders.append(S2SNode("dec", "emb"))
        self.dec_starts = []  # per decoder layer: the global index of its first self-attention head
        for layer, (n, c) in enumerate(zip(self.dec_heads, self.cross_heads)):
            self.dec_starts.append(len(senders))
            senders += [S2SNode("dec", "head", layer, h) for h in range(n)]
            senders += [S2SNode("cross", "head", layer, h) for h in range(c)]
            senders += [S2SNode("dec", "mlp", layer)] if mlp else []
        self.senders = senders
        ranges: dict[S2SReceiver, range] = {}
        for r in self.encoder.receivers[:-1]:
            node = S2SNode("enc", r.node.kind, r.node.layer, r.node.head)
            ranges[S2SReceiver(node, r.input)] = range(self.encoder.n_senders(r))
        everything_enc = range(self.n_enc_senders)
        for layer, (n, c) in enumerate(zip(self.dec_heads, self.cross_heads)):
            start = self.dec_starts[layer]
            before = range(self.n_enc_senders, start)
            for h in range(n):
                for w in QKV:
                    ranges[S2SReceiver(S2SNode("dec", "head", layer, h), w)] = before
            for h in range(c):
                ranges[S2SReceiver(S2SNode("cross", "head", layer, h), "q")] = range(self.n_enc_senders, start + n)
                ranges[S2SReceiver(S2SNode("cross", "head", layer, h), "k")] = everything_enc
                ranges[S2SReceiver(S2SNode("cross", "head", layer, h), "v")] = everything_enc
            if mlp:
                ranges[S2SReceiver(S2SNode("dec", "mlp", layer))] = range(self.n_enc_senders, start + n + c)
        ranges[S2SReceiver(S2SNode("dec", "logits", len(self.dec_heads)))] = range(self.n_enc_senders, len(senders))
        self.sender_ranges = ranges
        self.receivers = list(ranges)
        self.edges = [S2SEdge(self.senders[i], r) for r in self.receivers for i in ranges[r]]
        # the encoder's edges (its one-stack graph's, less those into its final stream) come first
        self.n_encoder_edges = len(self.encoder.edges) - self.n_enc_senders

    @classmethod
    def of(cls, model: EncoderDecoder) -> "Seq2SeqGraph":
        refuse_unsupported(model)
        heads = model.kind_heads_per_layer
        return cls(heads["enc"], heads["dec"], heads["cross"], model.cfg.mlp)

    @cached_property
    def edge_slices(self) -> dict[S2SReceiver, slice]:
        slices, start = {}, 0
        for r in self.receivers:
            slices[r] = slice(start, start + len(self.sender_ranges[r]))
            start = slices[r].stop
        return slices

    @cached_property
    def edge_index(self) -> dict[str, int]:
        return {e.name: i for i, e in enumerate(self.edges)}

    @cached_property
    def node_names(self) -> dict[str, S2SNode]:
        return {n.name: n for n in self.senders}

    @cached_property
    def receiver_names(self) -> dict[str, S2SReceiver]:
        return {r.name: r for r in self.receivers}

    def node(self, name: str, key: str = "circuits.senders") -> S2SNode:
        """The sender a name such as enc.L0H1, cross.L1H0, dec.L0.mlp or enc.emb names; one ConfigError otherwise."""
        if name.strip() not in self.node_names:
            raise ConfigError(key, name, f"no such sender in this model: senders are {self.sender_forms()}")
        return self.node_names[name.strip()]

    def receiver(self, name: str, key: str = "circuits.receivers") -> S2SReceiver:
        """The receiver input a name such as cross.L1H0.k, dec.L0.mlp or logits names; one ConfigError otherwise."""
        if name.strip() not in self.receiver_names:
            allowed = "enc.LlHh.q|k|v, enc.Ll.mlp, dec.LlHh.q|k|v, cross.LlHh.q|k|v, dec.Ll.mlp or logits"
            raise ConfigError(key, name, f"no such receiver input in this model: receivers are {allowed}")
        return self.receiver_names[name.strip()]

    def edge(self, name: str, key: str = "circuits.edge") -> S2SEdge:
        """The edge `sender -> receiver` names; one-line ConfigErrors for a name that is no node or receiver input of
        this model, or a receiver that does not read the sender."""
        parts = split_edge(name)
        if parts is None:
            raise ConfigError(key, name, "an edge is written 'sender -> receiver', e.g. 'enc.L0H1 -> cross.L1H0.k'")
        sender, receiver = parts
        if sender not in self.node_names:
            raise ConfigError(key, name, f"no sender {sender!r}: senders are {self.sender_forms()}")
        if receiver not in self.receiver_names:
            allowed = "enc.LlHh.q|k|v, enc.Ll.mlp, dec.LlHh.q|k|v, cross.LlHh.q|k|v, dec.Ll.mlp or logits"
            raise ConfigError(key, name, f"no receiver input {receiver!r} in this model: receivers are {allowed}")
        edge = edge_label(sender, receiver)
        if edge not in self.edge_index:
            raise ConfigError(
                key,
                name,
                f"{receiver} does not read {sender}: an encoder sender reaches the decoder only through the cross "
                "heads' .k and .v, which read the encoder alone; a receiver comes after its sender in its stack",
            )
        return self.edges[self.edge_index[edge]]

    def edges_named(self, names: list[str], key: str = "circuits.edges") -> list[int]:
        return [self.edge_index[self.edge(n, key).name] for n in names]

    def sender_forms(self) -> str:
        return "enc.emb, enc.LlHh, enc.Ll.mlp, dec.emb, dec.LlHh, cross.LlHh, dec.Ll.mlp"


def refuse_unsupported(model: object) -> None:
    """A one-line ConfigError for what the encoder-decoder's edges do not hold yet: a one-stack model (graph.py's
    Graph), T5's relative position bias (a head's scores read a bias table no edge carries), padded sources."""
    if not isinstance(model, EncoderDecoder):
        raise ConfigError(
            "model.encoder_layers",
            0,
            "Seq2SeqGraph takes an encoder-decoder; a one-stack model's edges are circuits.Graph's",
        )
    if model.cfg.positions == "relative":
        raise ConfigError(
            "model.positions",
            "relative",
            "edges through an encoder-decoder are not defined with T5's relative position bias yet (a head's scores "
            "read a bias table that no edge carries); they take every other model.positions",
        )

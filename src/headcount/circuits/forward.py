"""The edge-patched forward: the model run node by node, every receiver input built from its senders' outputs edge by
edge, each edge carrying this run's output or the corrupted run's (or a mix of the two).

Senders' outputs (`NodeOutputs`): emb's is the embedding (token embeddings times sqrt(d_model) where the model scales
them, plus learned positions), a head's is its z_h (B, T, D), an MLP's its output as added to the stream (after its
post-norm, if any). Every edge s -> r has a weight a in [0, 1] (a = 1: the edge is removed, "corrupted"), and a
receiver input is

    x_r = [emb + a (emb' - emb)] + sum_{layers l} A_l(r) + sum_{MLPs m} [m + a (m' - m)]

where ' marks the corrupted run and, for layer l's attention read by r,

    A_l(r) = post_norm_l( combine_l( z_h + a_{L l H h -> r} (z'_h - z_h) for every head h ) ),

combine_l being the layer's output projection with its bias, added once. In pre-norm families (no post-norm) A_l(r)
= sum_h z_h W_O^h + b_O with each head's term mixed by its own edge: the usual sum of per-head outputs. In families
whose attention output is normalised before it joins the stream (Gemma 2/3's sandwich, OLMo 2's post-norms) the
stream is not a sum of per-head terms, and this definition, mixing z before the norm per receiver, is the one that
stays exact: with every a = 0 every input is the plain model's stream (the forward equals the model's), with every
a = 1 every input reads only corrupted outputs (the forward equals the corrupted run). Nodes recompute from their
inputs: a head h of layer l computes q from its .q input, k and v from its .k and .v inputs, by the model's own
Block.heads_from_inputs (the layer's input norm, then MultiHeadAttention.project_inputs: under grouped-query attention
head h's k and v are its key/value head's, computed from h's own inputs, so heads of one group may see different
keys), then attends; an MLP applies its pre-norm, itself and its post-norm; the logits apply the final norm, the
unembedding (tied or not) and the final soft-cap. The run is the model's own forward (Transformer.forward_layers)
with an intervention: each receiver's input is put in at its site (a layer's heads' at attn.qkv_input, an MLP's at
mlp.input, the logits' in place of the last layer's resid_post) and each sender's output read at attn.z or mlp_out;
attention's contribution to a receiver is Block.attention_mix.

`reference` generalises the mix to x = out + a (out' - ref) with ref a fixed run's outputs: EAP-IG (attribution.py)
differentiates at a = 0 on interpolated inputs with ref the clean run. Dropout is not applied (call on a model in
eval mode).
"""

from dataclasses import dataclass, field

import torch
from torch import Tensor

from headcount.circuits.graph import Graph, Receiver
from headcount.circuits.mixing import linear_mix
from headcount.model.block import Block
from headcount.model.intervention import Hook, Intervention
from headcount.model.sites import Site
from headcount.model.transformer import Transformer


@dataclass
class NodeOutputs:
    """A run's sender outputs: emb (B, T, C), z per layer (B, T, H, D), MLP output per layer (B, T, C)."""

    emb: Tensor
    z: list[Tensor]
    mlp: list[Tensor]
    # the plain streams into receivers, by how many senders they read (plain_streams fills it once, when first asked)
    streams: dict[int, Tensor] | None = field(default=None, repr=False, compare=False)

    def repeat(self, n: int) -> "NodeOutputs":
        """n copies along the batch (copy i holds rows i*B .. (i+1)*B - 1), as an (n, E) weight batch runs."""

        def rep(t: Tensor) -> Tensor:
            return t.repeat(n, *[1] * (t.ndim - 1))

        return NodeOutputs(rep(self.emb), [rep(z) for z in self.z], [rep(m) for m in self.mlp])

    def minus(self, other: "NodeOutputs") -> "NodeOutputs":
        return NodeOutputs(
            self.emb - other.emb,
            [a - b for a, b in zip(self.z, other.z)],
            [a - b for a, b in zip(self.mlp, other.mlp)],
        )


def node_outputs(model: Transformer, ids_BT: Tensor) -> NodeOutputs:
    """One plain run's sender outputs (no edge touched), without gradients."""
    with torch.no_grad():
        return edge_stream(model, model.embed(ids_BT))[1]


def outputs_of(model: Transformer, run: "Tensor | NodeOutputs") -> NodeOutputs:
    """A corrupted run's sender outputs: from its token ids (B, T), or given directly (a replacement that is no run
    of the model, such as zero ablation's all-zero outputs)."""
    return run if isinstance(run, NodeOutputs) else node_outputs(model, run)


def edge_forward(
    model: Transformer,
    emb_BTC: Tensor,
    weights: Tensor | None = None,
    corrupted: NodeOutputs | None = None,
    reference: NodeOutputs | None = None,
) -> tuple[Tensor, NodeOutputs]:
    """Logits (N*B, T, V) and this run's sender outputs, for N edge-weight rows `weights` (N, E) in Graph.of(model)'s
    edge order (None: no edge touched, the plain forward). emb_BTC: this run's embedding, (B, T, C) shared by the
    N rows, or (N, B, T, C), one per row. corrupted, reference: (B, ...) outputs of the corrupted run and of the
    reference run (None: this run's own outputs, i.e. exact edge patching at weights in {0, 1})."""
    stream_RTC, outs = edge_stream(model, emb_BTC, weights, corrupted, reference)
    return model.unembed(stream_RTC), outs


def edge_stream(
    model: Transformer,
    emb_BTC: Tensor,
    weights: Tensor | None = None,
    corrupted: NodeOutputs | None = None,
    reference: NodeOutputs | None = None,
) -> tuple[Tensor, NodeOutputs]:
    """edge_forward's logits input (N*B, T, C), before the unembedding (which callers apply at their score points
    only), and the run's sender outputs."""
    if model.training:
        raise ValueError("the edge-patched forward applies no dropout: call it on a model in eval mode")
    graph = Graph.of(model)
    if weights is None and corrupted is None and reference is None and emb_BTC.ndim == 3:
        return _plain_stream(model, graph, emb_BTC)
    n = 1 if weights is None else weights.shape[0]
    if weights is not None and corrupted is None:
        raise ValueError("edge weights need the corrupted run's outputs (corrupted=node_outputs(model, ids))")
    if weights is not None and weights.shape[1] != len(graph.edges):
        raise ValueError(f"weights has {weights.shape[1]} edges; this model has {len(graph.edges)}")
    emb_BTC = emb_BTC.flatten(0, 1) if emb_BTC.ndim == 4 else emb_BTC.repeat(n, 1, 1)
    if weights is None:  # every receiver reads the plain stream (receiver_inputs without weights): the plain forward
        return _plain_stream(model, graph, emb_BTC)
    rows = emb_BTC.shape[0]
    target = corrupted.repeat(n) if n > 1 else corrupted
    ref = None if reference is None else reference.repeat(n) if n > 1 else reference
    outs = NodeOutputs(emb_BTC, [], [])
    # out' - ref per sender, each computed once, as the sender's output appears (ref: this run's own outputs unless a
    # reference run is given)
    base = outs if ref is None else ref
    delta = NodeOutputs(target.emb - base.emb, [], [])

    def inputs(receiver_slice: slice, count: int, n_senders: int) -> Tensor:
        """(rows, count, T, C): the inputs of `count` receivers whose edges are receiver_slice, n_senders each."""
        w = weights[:, receiver_slice].repeat_interleave(rows // n, dim=0).view(rows, count, n_senders)
        return receiver_inputs(model, graph, outs, delta, w, n_senders).expand(-1, count, -1, -1)

    def heads_input(first: int, n_heads: int, start: int) -> Hook:
        def put(x_RHWTC: Tensor, site: Site) -> Tensor:  # (rows, H, 3, T, C), head h's q, k, v inputs
            x_RXTC = inputs(slice(first, first + 3 * n_heads * start), 3 * n_heads, start)
            return x_RXTC.view(rows, n_heads, 3, *x_RXTC.shape[2:])

        return put

    def stream_input(receiver: Receiver) -> Hook:  # an MLP's input, or the logits'
        return lambda x_RTC, site: inputs(graph.edge_slices[receiver], 1, graph.n_senders(receiver))[:, 0]

    def sender(kind: str) -> Hook:
        def read(out: Tensor, site: Site) -> None:  # the sender's output, and out' - ref as it appears
            done = getattr(outs, kind)
            done.append(out)
            getattr(delta, kind).append(getattr(target, kind)[len(done) - 1] - getattr(base, kind)[len(done) - 1])

        return read

    # the model's own forward, every receiver's input put in at its site: a layer's heads' at attn.qkv_input (heads
    # without inputs of their own compute z from the stream, which every layer without heads leaves as it is), an
    # MLP's at mlp.input, the logits' in place of the last layer's output
    hooks: list[tuple[Site, Hook]] = []
    for layer in range(graph.n_layers):
        receivers = graph.layer_receivers(layer)
        if graph.heads_per_layer[layer]:
            first, n_heads = graph.edge_slices[receivers[0]].start, graph.heads_per_layer[layer]
            hooks.append((Site("attn.qkv_input", layer), heads_input(first, n_heads, graph.sender_start(layer))))
        hooks.append((Site("attn.z", layer), sender("z")))
        if graph.mlp:
            hooks += [(Site("mlp.input", layer), stream_input(receivers[-1])), (Site("mlp_out", layer), sender("mlp"))]
    hooks.append((Site("resid_post", graph.n_layers - 1), stream_input(graph.receivers[-1])))
    return model.forward_layers(emb_BTC, 0, Intervention(hooks)), outs


def _plain_stream(model: Transformer, graph: Graph, emb_BTC: Tensor) -> tuple[Tensor, NodeOutputs]:
    """edge_stream with no edge touched: the model's own forward (the same additions in the same order as
    receiver_inputs without weights makes for every receiver, so the same bits), reading the senders' outputs at
    attn.z and mlp_out."""
    outs = NodeOutputs(emb_BTC, [], [])
    hooks: list[tuple[Site, Hook]] = [(Site("attn.z", layer), keep_in(outs.z)) for layer in range(graph.n_layers)]
    if graph.mlp:
        hooks += [(Site("mlp_out", layer), keep_in(outs.mlp)) for layer in range(graph.n_layers)]
    return model.forward_layers(emb_BTC, 0, Intervention(hooks)), outs


def keep_in(into: list[Tensor]) -> Hook:
    """A hook that appends what reaches its site to `into` (a sender's outputs, layer by layer) and changes nothing."""

    def read(x: Tensor, site: Site) -> None:
        into.append(x)

    return read


def plain_streams(model: Transformer, graph: Graph, outs: NodeOutputs, counts: set[int]) -> dict[int, Tensor]:
    """{n: (B, T, C) the stream into a receiver that reads the first n senders} for each n in counts, every edge
    carrying outs: receiver_inputs without weights, the same additions in the same order (so the same bits). One
    running sum gives every count; outs keeps them (a run's streams are asked for again and again: per pass of
    path-patching pairs)."""
    if outs.streams is None:
        x_BTC, pos = outs.emb, 1
        found = {pos: x_BTC}
        for layer, block in enumerate(model.blocks):
            x_BTC = block.add_attn(x_BTC, attention_contribution(block, outs.z[layer], None, None)[:, 0])
            pos += graph.heads_per_layer[layer]
            found.setdefault(pos, x_BTC)  # a layer without heads adds only its bias: receivers at pos read before it
            if graph.mlp:
                x_BTC = block.add_mlp(x_BTC, outs.mlp[layer])
                pos += 1
                found.setdefault(pos, x_BTC)
        outs.streams = found
    return {n: outs.streams[n] for n in counts}


def receiver_inputs(
    model: Transformer, graph: Graph, outs: NodeOutputs, delta: NodeOutputs | None, w_RXS: Tensor | None, n_senders: int
) -> Tensor:
    """(rows, X, T, C): x = sum over the first n_senders senders of out + w (delta), per receiver (X of them); with
    w None (no edge weights) the plain stream, once (X = 1) for every receiver. Each addition is the block's own
    (add_attn, add_mlp): in a post-LN block (BERT) the sum is normalised after every addition, as the model does.
    Where the stream is a sum of per-sender terms the weighted mix is one matmul over the run's stacked deltas
    (mixing.py)."""
    if delta is not None and not untouched(w_RXS) and linear_stream(model):
        return linear_mix(model, graph, outs, delta, w_RXS, n_senders)

    def mixed(out: Tensor, d: Tensor | None, w_RX: Tensor | None) -> Tensor:
        if untouched(w_RX):
            return out[:, None]
        return out[:, None] + w_RX[:, :, None, None] * d[:, None]

    def plus(x: Tensor, term: Tensor) -> Tensor:
        """x + term, into x where x is this sum's own tensor and of the sum's shape (the same additions, so the same
        bits, without a new (rows, X, T, C) tensor per sender: fewer fresh pages for the allocator to map)."""
        if x is first or torch.broadcast_shapes(x.shape, term.shape) != x.shape:
            return x + term
        return x.add_(term)

    x = first = mixed(outs.emb, None if delta is None else delta.emb, None if w_RXS is None else w_RXS[:, :, 0])
    pos = 1
    for layer, block in enumerate(model.blocks):
        if pos >= n_senders:
            break
        n_heads = graph.heads_per_layer[layer]
        w_RXH = None if w_RXS is None else w_RXS[:, :, pos : pos + n_heads]
        attn_RXTC = attention_contribution(block, outs.z[layer], None if delta is None else delta.z[layer], w_RXH)
        # a post-LN block normalises after each addition: its receivers' inputs are rebuilt through its norms
        x = block.add_attn(x, attn_RXTC) if block.post_ln else plus(x, attn_RXTC)
        pos += n_heads
        if graph.mlp and pos < n_senders:
            w_RX = None if w_RXS is None else w_RXS[:, :, pos]
            mlp_RXTC = mixed(outs.mlp[layer], None if delta is None else delta.mlp[layer], w_RX)
            x = block.add_mlp(x, mlp_RXTC) if block.post_ln else plus(x, mlp_RXTC)
            pos += 1
    return x


def linear_stream(model: Transformer) -> bool:
    """Whether every receiver input is a plain sum of its senders' terms, linear in its edge weights with frozen
    output projections (mixing.py's matmul; Block.sums_head_terms)."""
    grad = torch.is_grad_enabled()
    return all(block.sums_head_terms(grad) for block in model.blocks)


def untouched(w: Tensor | None) -> bool:
    """No weight, or weights all zero and not differentiated: the mix is the output itself, out + 0 (out' - out) = out
    to the bit, so a pass skips it (one receiver input shared by all, broadcast; an exact scan's pass removes a few
    edges and leaves most senders' mixes untouched)."""
    return w is None or (not w.requires_grad and not bool(w.any()))


def attention_contribution(block: Block, z_BTHD: Tensor, dz_BTHD: Tensor | None, w_BXH: Tensor | None) -> Tensor:
    """(B, X, T, C): post_norm(combine(z + w dz)) per receiver, z mixed per head by that receiver's edge weights
    (Block.attention_mix); untouched weights (untouched) mix nothing."""
    return block.attention_mix(z_BTHD, dz_BTHD, None if untouched(w_BXH) else w_BXH)

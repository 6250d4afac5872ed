"""The edge-patched forward of an encoder-decoder (seq2seq_graph.py): every receiver input built from its senders'
outputs edge by edge, each edge carrying this run's output or the corrupted run's (or a mix, a in [0, 1]).

- The encoder is forward.py's one-stack edge forward (its heads' q, k, v and its MLPs; post-LN blocks rebuilt through
  their norms), run with the encoder's edges.
- A cross-attention head's .k and .v each read their own copy of the encoder's final stream,
  x = sum over every encoder sender of out + a (out' - ref) (forward.py's receiver_inputs, the blocks' own additions),
  then the encoder's final norm (EncoderDecoder.memory_of): the norm is not linear, so each copy passes it alone.
- The decoder runs node by node: a layer's self-attention heads from their own q, k, v inputs
  (Block.heads_from_inputs, causal), its cross heads from their own .q input and their .k and .v memories
  (Block.cross_from_inputs), its MLP from its input (Block.mlp_out), the logits from theirs (the final norm and the
  unembedding). A decoder receiver's input is
      x_r = [emb + a (emb' - ref)] + per layer: A_l(r), C_l(r), [m + a (m' - ref)]
  added by the block's own additions (add_attn, add_cross_out, add_mlp: normalised after each in a post-LN block),
  with A_l(r) = post_norm(combine(z_h + a (z'_h - ref_h))) over the self-attention heads (Block.attention_mix) and
  C_l(r) the same over the cross heads (Block.cross_mix).

With every a = 0 this is the model's own forward, with every a = 1 the corrupted run (tests/test_seq2seq_edges.py).
`reference` None: ref is this run's own outputs (exact edge patching at a in {0, 1}); EAP-IG passes the clean run's.
Sources have one length (no padding): an encoder reads every source position.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from headcount.circuits.forward import NodeOutputs, edge_stream, receiver_inputs, untouched
from headcount.circuits.seq2seq_graph import S2SReceiver, Seq2SeqGraph
from headcount.model.encoder_decoder import EncoderDecoder


@dataclass
class DecoderOutputs:
    """The decoder's sender outputs: emb (B, T, C), self-attention z per layer (B, T, H, D), cross-attention z per
    layer (B, T, H_c, D), MLP output per layer (B, T, C)."""

    emb: Tensor
    z: list[Tensor]
    cross: list[Tensor]
    mlp: list[Tensor]

    def map(self, fn) -> "DecoderOutputs":
        return DecoderOutputs(
            fn(self.emb), [fn(t) for t in self.z], [fn(t) for t in self.cross], [fn(t) for t in self.mlp]
        )

    def minus(self, other: "DecoderOutputs") -> "DecoderOutputs":
        pairs = zip(self.z, other.z), zip(self.cross, other.cross), zip(self.mlp, other.mlp)
        return DecoderOutputs(self.emb - other.emb, *[[a - b for a, b in p] for p in pairs])


@dataclass
class Seq2SeqOutputs:
    """A run's sender outputs: the encoder's (forward.NodeOutputs) and the decoder's."""

    enc: NodeOutputs
    dec: DecoderOutputs

    def repeat(self, n: int) -> "Seq2SeqOutputs":
        return Seq2SeqOutputs(self.enc.repeat(n), self.dec.map(lambda t: t.repeat(n, *[1] * (t.ndim - 1))))

    def examples(self, at: slice) -> "Seq2SeqOutputs":
        enc = NodeOutputs(self.enc.emb[at], [z[at] for z in self.enc.z], [m[at] for m in self.enc.mlp])
        return Seq2SeqOutputs(enc, self.dec.map(lambda t: t[at]))

    def zeros(self) -> "Seq2SeqOutputs":
        """Every sender's output zero: zero ablation's replacement (an edge that carries nothing)."""
        enc = NodeOutputs(torch.zeros_like(self.enc.emb), [z * 0 for z in self.enc.z], [m * 0 for m in self.enc.mlp])
        return Seq2SeqOutputs(enc, self.dec.map(torch.zeros_like))


def seq2seq_outputs(model: EncoderDecoder, src_BS: Tensor, tgt_BT: Tensor) -> Seq2SeqOutputs:
    """One plain run's sender outputs (no edge touched), without gradients."""
    with torch.no_grad():
        return seq2seq_stream(model, model.encoder.embed(src_BS), model.decoder.embed(tgt_BT))[1]


def seq2seq_edge_logits(
    model: EncoderDecoder,
    src_BS: Tensor,
    tgt_BT: Tensor,
    weights_NE: Tensor | None = None,
    corrupted: Seq2SeqOutputs | None = None,
) -> Tensor:
    """Logits (N*B, T, V) of the edge-patched forward at N rows of edge weights (Seq2SeqGraph.of(model).edges' order;
    1 = removed: the edge carries the corrupted run's output), teacher forced on tgt."""
    stream, _ = seq2seq_stream(model, model.encoder.embed(src_BS), model.decoder.embed(tgt_BT), weights_NE, corrupted)
    return model.decoder.unembed(stream)


def seq2seq_stream(
    model: EncoderDecoder,
    enc_emb: Tensor,
    dec_emb: Tensor,
    weights_NE: Tensor | None = None,
    corrupted: Seq2SeqOutputs | None = None,
    reference: Seq2SeqOutputs | None = None,
    held_NR: Tensor | None = None,
    clean: Seq2SeqOutputs | None = None,
) -> tuple[Tensor, Seq2SeqOutputs]:
    """The logits' input (N*B, T, C) and the run's sender outputs. enc_emb, dec_emb: this run's embeddings, (B, ., C)
    shared by the N rows or (N, B, ., C), one per row (EAP-IG's steps); corrupted, reference: (B, ...) outputs.
    held_NR: (N, receivers) bool, the receivers (decoder and cross receivers only) whose inputs are built from the
    `clean` run's outputs rather than this run's, out_clean + a (out' - out_clean): path patching's receivers, held
    at their clean inputs but for the patched senders (seq2seq_path_patching.py)."""
    if model.training:
        raise ValueError("the edge-patched forward applies no dropout: call it on a model in eval mode")
    graph = Seq2SeqGraph.of(model)
    n = 1 if weights_NE is None else weights_NE.shape[0]
    if weights_NE is None:
        weights_NE = dec_emb.new_zeros(n, len(graph.edges))
    if weights_NE.shape[1] != len(graph.edges):
        raise ValueError(f"weights has {weights_NE.shape[1]} edges; this model has {len(graph.edges)}")
    if corrupted is None and (bool(weights_NE.any()) or weights_NE.requires_grad):
        raise ValueError("edge weights need the corrupted run's outputs (corrupted=seq2seq_outputs(model, ...))")
    target = None if corrupted is None else corrupted.repeat(n) if n > 1 else corrupted
    ref = None if reference is None else reference.repeat(n) if n > 1 else reference

    # the encoder: forward.py's edge forward with its edges (those into its final stream untouched)
    enc_w = torch.cat([weights_NE[:, : graph.n_encoder_edges], weights_NE.new_zeros(n, graph.n_enc_senders)], 1)
    enc_args = (
        (None, None, None) if corrupted is None else (enc_w, corrupted.enc, None if ref is None else reference.enc)
    )
    _, enc_outs = edge_stream(model.encoder, enc_emb, *enc_args)
    rows = len(enc_outs.emb)
    enc_delta = None if target is None else target.enc.minus(enc_outs if ref is None else ref.enc)

    def gather(receivers: list[S2SReceiver]) -> Tensor | None:
        """(rows, X, senders) the weights of X receivers that read the same senders."""
        if target is None:
            return None
        index = torch.cat([torch.arange(graph.edge_slices[r].start, graph.edge_slices[r].stop) for r in receivers])
        w_NXS = weights_NE[:, index.to(weights_NE.device)].view(n, len(receivers), -1)
        return w_NXS.repeat_interleave(rows // n, dim=0)

    dec = model.decoder
    dec_emb = dec_emb.flatten(0, 1) if dec_emb.ndim == 4 else dec_emb.expand(n, *dec_emb.shape).flatten(0, 1)
    outs = DecoderOutputs(dec_emb, [], [], [])
    base = outs if ref is None else ref.dec
    delta = None if target is None else DecoderOutputs(target.dec.emb - base.emb, [], [], [])

    held = None
    if held_NR is not None:
        held = clean.repeat(n) if n > 1 else clean
        held_delta = Seq2SeqOutputs(target.enc.minus(held.enc), target.dec.minus(held.dec))
        receiver_at = {r: i for i, r in enumerate(graph.receivers)}

    def held_of(receivers: list[S2SReceiver]) -> Tensor | None:
        """(rows, X) bool: which of the receivers read the clean run's outputs; None where none does."""
        if held_NR is None:
            return None
        index = torch.tensor([receiver_at[r] for r in receivers], device=held_NR.device)
        held_RX = held_NR[:, index].repeat_interleave(rows // n, dim=0)
        return held_RX if bool(held_RX.any()) else None

    def inputs(receivers: list[S2SReceiver]) -> Tensor:
        """(rows, X, T, C): the decoder-stream inputs of X receivers reading the same senders."""
        n_senders, w_RXS = len(graph.sender_ranges[receivers[0]]), gather(receivers)
        x_RXTC = decoder_inputs(model, graph, outs, delta, w_RXS, n_senders).expand(-1, len(receivers), -1, -1)
        held_RX = held_of(receivers)
        if held_RX is None:
            return x_RXTC
        clean_RXTC = decoder_inputs(model, graph, held.dec, held_delta.dec, w_RXS, n_senders).expand_as(x_RXTC)
        return torch.where(held_RX[:, :, None, None], clean_RXTC, x_RXTC)

    def memories(receivers: list[S2SReceiver]) -> Tensor:
        """(rows, X, S, C): the encoder's output as each of X cross-head .k/.v inputs reads it."""
        w_RXS, n_enc = gather(receivers), graph.n_enc_senders
        x_RXSC = receiver_inputs(model.encoder, graph.encoder, enc_outs, enc_delta, w_RXS, n_enc)
        x_RXSC = x_RXSC.expand(-1, len(receivers), -1, -1)
        held_RX = held_of(receivers)
        if held_RX is not None:
            clean_RXSC = receiver_inputs(model.encoder, graph.encoder, held.enc, held_delta.enc, w_RXS, n_enc)
            x_RXSC = torch.where(held_RX[:, :, None, None], clean_RXSC.expand_as(x_RXSC), x_RXSC)
        return model.memory_of(x_RXSC)

    for layer, block in enumerate(dec.blocks):
        H, Hc = graph.dec_heads[layer], graph.cross_heads[layer]
        qkv = [r for r in graph.receivers if r.node.stack == "dec" and r.node.kind == "head" and r.node.layer == layer]
        if H:
            x_RXTC = inputs(qkv)
            z_RTHD = block.heads_from_inputs(x_RXTC.reshape(rows, H, 3, *x_RXTC.shape[2:]))
        else:
            z_RTHD = dec_emb.new_zeros(rows, dec_emb.shape[1], 0, block.attn.head_dim)
        record(outs, delta, target, base, "z", z_RTHD)
        cross = [r for r in graph.receivers if r.node.stack == "cross" and r.node.layer == layer]
        queries = [r for r in cross if r.input == "q"]
        keys_values = [r for r in cross if r.input != "q"]
        q_RHTC = inputs(queries)
        memory_RHWSC = memories(keys_values).reshape(rows, Hc, 2, *enc_outs.emb.shape[1:])
        record(outs, delta, target, base, "cross", block.cross_from_inputs(q_RHTC, memory_RHWSC))
        if graph.mlp:
            x_RTC = inputs([S2SReceiver(graph.node_names[f"dec.L{layer}.mlp"])])[:, 0]
            record(outs, delta, target, base, "mlp", block.mlp_out(x_RTC))
    return inputs([graph.receivers[-1]])[:, 0], Seq2SeqOutputs(enc_outs, outs)


def record(outs: DecoderOutputs, delta, target, base, kind: str, out: Tensor) -> None:
    """A decoder sender's output, and out' - ref as it appears."""
    done = getattr(outs, kind)
    done.append(out)
    if delta is not None:
        i = len(done) - 1
        getattr(delta, kind).append(getattr(target.dec, kind)[i] - getattr(base, kind)[i])


def decoder_inputs(
    model: EncoderDecoder,
    graph: Seq2SeqGraph,
    outs: DecoderOutputs,
    delta: DecoderOutputs | None,
    w_RXS: Tensor | None,
    n_senders: int,
) -> Tensor:
    """(rows, X, T, C): x = the first n_senders decoder senders' outputs out + w (delta), added by the blocks' own
    additions (module docstring); w None: the plain stream (X = 1)."""

    def weights(start: int, count: int) -> Tensor | None:
        w = None if w_RXS is None else w_RXS[:, :, start : start + count]
        return None if untouched(w) else w

    def mixed(out: Tensor, d: Tensor | None, w_RX1: Tensor | None) -> Tensor:
        return out[:, None] if w_RX1 is None else out[:, None] + w_RX1[:, :, 0, None, None] * d[:, None]

    x = mixed(outs.emb, None if delta is None else delta.emb, weights(0, 1))
    pos = 1
    for layer, block in enumerate(model.decoder.blocks):
        H, Hc = graph.dec_heads[layer], graph.cross_heads[layer]
        if pos >= n_senders:
            break
        w = weights(pos, H)
        x = block.add_attn(x, block.attention_mix(outs.z[layer], None if w is None else delta.z[layer], w))
        pos += H
        if pos >= n_senders:
            break
        w = weights(pos, Hc)
        x = block.add_cross_out(x, block.cross_mix(outs.cross[layer], None if w is None else delta.cross[layer], w))
        pos += Hc
        if graph.mlp and pos < n_senders:
            w = weights(pos, 1)
            x = block.add_mlp(x, mixed(outs.mlp[layer], None if w is None else delta.mlp[layer], w))
            pos += 1
    return x

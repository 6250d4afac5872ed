"""The metric's gradient at every receiver input in one forward and one backward: the half of EAP that needs the model.

At edge weights a = 0 every receiver of a layer reads the same stream, so the edge-patched forward (forward.py) is the
plain forward, and d metric / d a_{s->r} = (out'_s - out_s as it enters the stream) . g_r with g_r = d metric / d x_r
the gradient at receiver r's own input (attribution.py does the dot products). This forward, the model's own with taps
at named sites (run_layers), gives every receiver its own copy of what it reads, so one backward yields every g_r: head
h of layer l reads its q, k and v through three copies of layer l's normed input (the site attn.qkv_normed, the
edge-patched forward's own head computation; the norm is computed once and each copy's gradient taken back through its
Jacobian), an MLP reads a copy of the stream after its layer's heads (before them in a parallel block; mlp.input), the
logits a copy of the last stream. Each copy is a tensor of its
own in the autograd graph: its gradient is its readers' alone, and the backward flows on through it into the senders
before. The forward costs about one plain forward (a head's k and v projections run per query head under grouped-query
attention) and holds every copy and its gradient: 3H + 1 streams per layer.

Where a layer's attention output passes a post-norm before joining the stream (Gemma 2/3, OLMo 2), the run keeps that
layer's combined output before the norm (`combined`), at which attribution.py takes the norm's Jacobian.
"""

from dataclasses import dataclass, field

import torch
from torch import Tensor

from headcount.circuits.forward import NodeOutputs
from headcount.circuits.graph import Graph
from headcount.circuits.metric import Metric, point_values
from headcount.circuits.passes import outputs_floats, points_floats
from headcount.model.block import Block
from headcount.model.intervention import Hook, Intervention
from headcount.model.sites import Site
from headcount.model.transformer import Transformer


@dataclass
class ReceiverGradients:
    """d metric / d x_r for every receiver input, rows as the forward's (N*B) batch, and what the run computed.

    heads: per layer (H, 3, rows, T, C), head h's q, k, v inputs; mlp: per layer (rows, T, C) (empty without MLPs);
    logits: (rows, T, C); combined: per layer, attention's combined output before its post-norm (None without one);
    outputs: this run's sender outputs."""

    heads: list[Tensor]
    mlp: list[Tensor]
    logits: Tensor
    combined: list[Tensor | None]
    outputs: NodeOutputs


def receiver_gradients(model: Transformer, emb_RTC: Tensor, points_BT: Tensor, metric: Metric) -> ReceiverGradients:
    """The gradients of the metric summed over the points of rows = N * B runs (emb_RTC: each run's embedding, runs
    of the B examples of points_BT stacked N times along the batch) at every receiver input, in model dtype."""
    graph = Graph.of(model)
    x_RTC, outs, taps = run_layers(model, emb_RTC.detach().requires_grad_(), copied=True)
    n = len(x_RTC) // len(points_BT)
    # the stream: the logits' input at the end, read by them alone
    logits_NPV = model.unembed(x_RTC.view(n, *points_BT.shape, -1)[:, points_BT])
    grads = dict(zip(taps.kept, torch.autograd.grad(point_values(logits_NPV, metric).sum(), [*taps.kept.values()])))
    heads, mlp = [], []
    for layer in range(graph.n_layers):
        if graph.heads_per_layer[layer]:
            grads_HWRTC = grads[Site("attn.qkv_normed", layer)].permute(1, 2, 0, 3, 4)
            heads.append(before_norm(model.blocks[layer], taps.stream_in[layer], grads_HWRTC))
        else:
            heads.append(x_RTC.new_zeros(0, 3, *x_RTC.shape))
        if graph.mlp:
            mlp.append(grads[Site("mlp.input", layer)])
    return ReceiverGradients(heads, mlp, grads[LOGITS_INPUT], taps.combined, outs)


def unit_bytes(model: Transformer, T: int, points: int, reference: bool = False) -> int:
    """A generous estimate of what one run (row) of one example holds in receiver_gradients and the products that
    read them (attribution.EdgeGradients): per layer, the heads' normed copies and their per-head projections (the
    whole projection per copy under OLMo 2's q/k norm) and the block's own activations, kept for the backward; every
    receiver input's gradient (and once more for the layer at work, through its norm); the senders' deltas; this
    run's, the corrupted run's and their difference's outputs (and with a reference run, EAP-IG's, its outputs and the
    gradients summed over the steps); the logits at the points."""
    graph, C = Graph.of(model), model.cfg.d_model
    per_position = 0
    for layer, block in enumerate(model.blocks):
        attn, inputs = block.attn, 3 * graph.heads_per_layer[layer]
        per_position += inputs * C + 2 * inputs * attn.head_dim + block.activation_floats(T)
        per_position += inputs * attn.input_projection_floats()
    widest = 3 * max(graph.heads_per_layer, default=0) * C
    per_position += (len(graph.receivers) + len(graph.senders)) * C + 4 * widest
    if reference:  # the steps' summed gradients, and their next sum beside them
        per_position += 2 * len(graph.receivers) * C
    floats = T * per_position + (4 + int(reference)) * outputs_floats(model, T) + 2 * points_floats(model, points)
    return floats * next(model.parameters()).element_size()


def plain_outputs(model: Transformer, ids_BT: Tensor) -> NodeOutputs:
    """A plain run's sender outputs (as forward.py's node_outputs), in one pass through the layers."""
    with torch.no_grad():
        return run_layers(model, model.embed(ids_BT), copied=False)[1]


def before_norm(block: Block, at_RTC: Tensor, grads_HWRTC: Tensor) -> Tensor:
    """(H, 3, rows, T, C): each gradient at a normed copy of the stream into `block` taken back through its input norm
    at `at` (Block.input_norm_vjp)."""
    return block.input_norm_vjp(at_RTC, grads_HWRTC)


@dataclass
class Taps:
    """What a gradient run keeps beside the senders' outputs: the tensors whose gradients are the receivers' (by
    site: each layer's attn.qkv_normed and mlp.input, the logits' input last), the stream into each layer with heads
    (where before_norm linearises the input norm; None without heads) and each layer's combined attention output
    before its post-norm (None without one)."""

    kept: dict[Site, Tensor] = field(default_factory=dict)
    stream_in: list[Tensor | None] = field(default_factory=list)
    combined: list[Tensor | None] = field(default_factory=list)


LOGITS_INPUT = Site("logits")  # the key of the logits' input among a run's taps (no site of the forward_layers run)


def run_layers(model: Transformer, emb_RTC: Tensor, copied: bool) -> tuple[Tensor, NodeOutputs, Taps]:
    """The plain forward from the embedding, the model's own (Transformer.forward_layers): the last stream, the
    senders' outputs (detached), and with `copied` the receivers' taps.

    The taps are hooks of the forward's intervention: a head's q, k, v inputs are its copies of the layer's normed
    stream (the site attn.qkv_normed, (rows, H, 3, T, C), which runs the heads from them: Block.heads_from_own_inputs,
    the edge-patched forward's own head computation; the norm is computed once and before_norm takes each copy's
    gradient back through its Jacobian, cheaper than normalising 3H copies), an MLP's input is a clone of what it reads
    (mlp.input: its own, the stream goes on without it), the logits' input a clone of the last stream. Each tap is a
    tensor of its own in the autograd graph: its gradient is its readers' alone, and the backward flows on through it
    into the senders before."""
    if model.training:
        raise ValueError("the gradient forward applies no dropout: call it on a model in eval mode")
    if model.cfg.post_ln:  # a receiver's input is no sum of its senders' outputs: attribution.py takes that apart
        raise ValueError("a post-LN model's edge gradients are the edge-patched forward's (circuits/autograd_edges.py)")
    graph = Graph.of(model)
    outs, taps = NodeOutputs(emb_RTC.detach(), [], []), Taps()

    def sender(into: list[Tensor]) -> Hook:
        def read(x: Tensor, site: Site) -> None:
            into.append(x.detach())

        return read

    def tap(x: Tensor, site: Site) -> Tensor:
        taps.kept[site] = x if site.kind == "attn.qkv_normed" else x.clone()  # the copies are fresh already
        return taps.kept[site]

    def stream_in(x: Tensor, site: Site) -> None:
        taps.stream_in.append(x.detach())

    def combined(z_RTHD: Tensor, site: Site) -> None:
        block = model.blocks[site.layer]
        taps.combined.append(block.combined_attention(z_RTHD).detach() if block.attention_post_norm else None)

    hooks: list[tuple[Site, Hook]] = []
    for layer in range(graph.n_layers):
        if copied and graph.heads_per_layer[layer]:
            hooks += [(Site("resid_pre", layer), stream_in), (Site("attn.qkv_normed", layer), tap)]
        elif copied:
            hooks.append((Site("resid_pre", layer), lambda x, site: taps.stream_in.append(None)))
        hooks.append((Site("attn.z", layer), sender(outs.z)))
        if copied:
            hooks.append((Site("attn.z", layer), combined))
        if graph.mlp:
            hooks += [(Site("mlp.input", layer), tap)] if copied else []
            hooks.append((Site("mlp_out", layer), sender(outs.mlp)))
    x_RTC = model.forward_layers(emb_RTC, 0, Intervention(hooks))
    if copied:
        taps.kept[LOGITS_INPUT] = x_RTC = x_RTC.clone()
    return x_RTC, outs, taps

"""The metric's gradient at every receiver input in one forward and one backward: the half of EAP that needs the model.

At edge weights a = 0 every receiver of a layer reads the same stream, so the edge-patched forward (forward.py) is the
plain forward, and d metric / d a_{s->r} = (out'_s - out_s as it enters the stream) . g_r with g_r = d metric / d x_r
the gradient at receiver r's own input (attribution.py does the dot products). This forward gives every receiver its own
copy of what it reads, so one backward yields every g_r: head h of layer l reads its q, k and v through three copies of
layer l's normed input (heads_from_inputs, the edge-patched forward's own head computation; the norm is computed once
and each copy's gradient taken back through its Jacobian), an MLP reads a copy of the stream after its layer's heads
(before them in a parallel block), the logits the last stream (which nothing else reads). Each copy is a tensor of its
own in the autograd graph: its gradient is its readers' alone, and the backward flows on through it into the senders
before. The forward costs about one plain forward (a head's k and v projections run per query head under grouped-query
attention) and holds every copy and its gradient: 3H + 1 streams per layer.

Where a layer's attention output passes a post-norm before joining the stream (Gemma 2/3, OLMo 2), the run keeps that
layer's combined output before the norm (`combined`), at which attribution.py takes the norm's Jacobian.
"""

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from headcount.circuits.forward import NodeOutputs
from headcount.circuits.graph import Graph
from headcount.circuits.metric import Metric, point_values
from headcount.circuits.passes import outputs_floats, points_floats
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
    # the stream: the logits' input at the end, read by them alone
    x_RTC, outs, copies, combined, head_inputs = run_layers(model, emb_RTC.detach().requires_grad_(), copied=True)
    n = len(x_RTC) // len(points_BT)
    logits_NPV = model.unembed(x_RTC.view(n, *points_BT.shape, -1)[:, points_BT])
    grads = torch.autograd.grad(point_values(logits_NPV, metric).sum(), [*copies, x_RTC])
    heads, mlp, i = [], [], 0
    for layer in range(graph.n_layers):
        if graph.heads_per_layer[layer]:
            heads.append(before_norm(model.blocks[layer].ln_attn, head_inputs[layer], grads[i]))
            i += 1
        else:
            heads.append(x_RTC.new_zeros(0, 3, *x_RTC.shape))
        if graph.mlp:
            mlp.append(grads[i])
            i += 1
    return ReceiverGradients(heads, mlp, grads[-1], combined, outs)


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


def before_norm(norm: nn.Module, at_RTC: Tensor, grads_XRTC: Tensor) -> Tensor:
    """(X, rows, T, C): each gradient at a normed copy of the stream taken back through the norm at `at`, J^T g,
    all X at once (one linearisation, mapped over the copies)."""
    _, vjp = torch.func.vjp(norm, at_RTC)
    return torch.vmap(vjp)(grads_XRTC.flatten(0, 1))[0].view_as(grads_XRTC)


def run_layers(
    model: Transformer, emb_RTC: Tensor, copied: bool
) -> tuple[Tensor, NodeOutputs, list[Tensor], list[Tensor | None], list[Tensor | None]]:
    """The plain forward from the embedding: the last stream, the senders' outputs (detached), and with `copied` every
    receiver's own copy of its input (in model order, a layer's heads' (H, 3, rows, T, C), then its MLP's), each
    layer's attention output before its post-norm (None without one) and the stream its heads read (None without
    heads or copies).

    The heads' copies are of the stream after the layer's input norm, computed once: heads_from_inputs, which applies
    that norm to each of its 3H inputs, reads them through an identity, and before_norm takes each copy's gradient
    back through the norm's Jacobian (cheaper than normalising 3H copies forward and backward)."""
    if model.training:
        raise ValueError("the gradient forward applies no dropout: call it on a model in eval mode")
    if model.cfg.post_ln:  # a receiver's input is no sum of its senders' outputs: attribution.py takes that apart
        raise ValueError("a post-LN model's edge gradients are the edge-patched forward's (circuits/autograd_edges.py)")
    graph = Graph.of(model)
    x_RTC = emb_RTC
    outs = NodeOutputs(emb_RTC.detach(), [], [])
    copies: list[Tensor] = []
    combined: list[Tensor | None] = []
    head_inputs: list[Tensor | None] = []
    for layer, block in enumerate(model.blocks):
        n_heads = graph.heads_per_layer[layer]
        head_inputs.append(x_RTC.detach() if n_heads and copied else None)
        if n_heads and copied:
            normed_RTC = block.ln_attn(x_RTC)
            copy_HWRTC = normed_RTC.expand(n_heads, 3, *normed_RTC.shape).contiguous()
            copies.append(copy_HWRTC)
            z_RTHD = block.attn.heads_from_inputs(copy_HWRTC.permute(2, 0, 1, 3, 4))
        elif n_heads:
            z_RTHD = block.attn.heads(block.ln_attn(x_RTC))
        else:
            z_RTHD = x_RTC.new_zeros(*x_RTC.shape[:2], 0, block.attn.head_dim)
        outs.z.append(z_RTHD.detach())
        attn_RTC = block.attn.combine_heads(z_RTHD)
        combined.append(None if block.ln_attn_out is None else attn_RTC.detach())
        attn_RTC = block.drop(attn_RTC if block.ln_attn_out is None else block.ln_attn_out(attn_RTC))
        if not graph.mlp:
            x_RTC = x_RTC + attn_RTC
            continue
        mlp_in_RTC = x_RTC if graph.parallel_residual else x_RTC + attn_RTC
        if copied:
            mlp_in_RTC = mlp_in_RTC.clone()
            copies.append(mlp_in_RTC)
        mlp_RTC = block.drop(block.mlp_out(mlp_in_RTC))
        outs.mlp.append(mlp_RTC.detach())
        x_RTC = x_RTC + attn_RTC + mlp_RTC
    return x_RTC, outs, copies, combined, head_inputs

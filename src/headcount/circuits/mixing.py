"""The receiver mix of the edge-patched forward (circuits/forward.py) as one batched matrix product, for models whose
stream is a sum of per-sender terms (no attention post-norm).

There every receiver input is linear in its edge weights:

    x_r = plain_n + sum_{s < n} a_{s->r} d_s,

plain_n the stream of this run's own outputs into a receiver reading the first n senders, d_s sender s's delta as it
joins the stream (emb's and an MLP's delta itself, head h's dz_h W_O^h). Stacking the d_s of one run once, as the
senders appear ((R, S, T*C), a buffer outside autograd), the X receivers of a layer read (R, X, S) @ (R, S, T*C) plus
plain_n: one matmul, where the per-sender form adds X-wide products layer by layer and keeps each for the backward
(O(layers^2) tensors of X * T * C). The backward uses the same linearity (the identity EAP reads edge scores by):
d loss / d a_{s->r} = <d_s, d loss / d x_r> and d loss / d d_s = sum_r a_{s->r} d loss / d x_r, so `_Mix` saves only
the weights; the stacked deltas are held once per run, however many receivers read them. d loss / d d_s flows on to
the sender's own delta (head h's through W_O^h), so the deltas' dependence on earlier weights is differentiated as
the per-sender form does (each group's gradient summed by autograd over its readers, then taken back through
W_O once); the model's weights get no gradient (the caller checks none is asked for).
"""

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from headcount.circuits.graph import Graph
from headcount.model.transformer import Transformer


class SenderStack:
    """One run's sender deltas as they join the stream, (R, S, T*C) outside autograd, filled group by group (emb, a
    layer's heads, its MLP); `parts` keeps each group's autograd tensor and how it maps into the stack."""

    def __init__(self, model: Transformer, graph: Graph, delta) -> None:
        R, T, C = delta.emb.shape
        self.model, self.graph = model, graph  # not delta: the cache keys on it weakly, a reference would keep it
        self.shape = (R, T, C)
        self.buffer = delta.emb.new_empty(R, len(graph.senders), T * C)
        self.filled = 0
        self.next_layer, self.next_is_mlp = 0, False
        self.parts: list[tuple[int, Tensor]] = []  # (start, (R, count, T, C) the group's deltas, with autograd)

    def add(self, group_RNTC: Tensor) -> None:
        """Append a group of senders' deltas as they join the stream: a copy in the stack, the tensor in parts (its
        gradient flows back through it: a head's to dz via W_O, once however many receivers read it)."""
        count = group_RNTC.shape[1]
        with torch.no_grad():
            self.buffer[:, self.filled : self.filled + count] = group_RNTC.flatten(2)
        self.parts.append((self.filled, group_RNTC))
        self.filled += count

    def fill(self, delta, n_senders: int) -> None:
        """Stack the senders up to n_senders (receivers read prefixes that end on a group)."""
        R, T, C = self.shape
        if self.filled == 0 and n_senders > 0:
            self.add(delta.emb[:, None])
        while self.filled < n_senders:
            layer, block = self.next_layer, self.model.blocks[self.next_layer]
            if not self.next_is_mlp:
                if self.graph.heads_per_layer[layer]:
                    self.add(block.head_terms(delta.z[layer], "bhtc"))
                self.next_is_mlp = self.graph.mlp
                self.next_layer += 0 if self.graph.mlp else 1
            else:
                self.add(delta.mlp[layer][:, None])
                self.next_is_mlp, self.next_layer = False, layer + 1
        if self.filled != n_senders:
            raise RuntimeError(f"receivers read {n_senders} senders, not a prefix ending on a group ({self.filled})")


class PlainPrefix:
    """The stream of one run's own outputs into receivers reading the first n senders, summed as forward.py's
    receiver_inputs does without weights (a layer's attention term, bias included, once a receiver reads past its
    first sender; its MLP once it reads past its heads), one running sum for a forward's increasing n."""

    def __init__(self, model: Transformer, graph: Graph, outs) -> None:
        self.model, self.graph = model, graph  # not outs: the cache keys on it weakly, a reference would keep it
        self.found: dict[int, Tensor] = {}
        self.x, self.layer, self.at_mlp, self.last_n = outs.emb, 0, False, 0

    def stream(self, outs, n_senders: int) -> Tensor:
        if n_senders in self.found:
            return self.found[n_senders]
        if n_senders < self.last_n:  # asked out of order: sum afresh
            return PlainPrefix(self.model, self.graph, outs).stream(outs, n_senders)
        graph = self.graph
        while self.layer < graph.n_layers:
            start = graph.sender_start(self.layer)
            if not self.at_mlp:
                if start >= n_senders:
                    break
                block = self.model.blocks[self.layer]
                self.x = self.x + block.attention_mix(outs.z[self.layer], None, None)[:, 0]
                self.at_mlp = graph.mlp
                self.layer += 0 if graph.mlp else 1
            else:
                if start + graph.heads_per_layer[self.layer] >= n_senders:
                    break
                self.x = self.x + outs.mlp[self.layer]
                self.at_mlp, self.layer = False, self.layer + 1
        self.found[n_senders], self.last_n = self.x, n_senders
        return self.x


_stacks: WeakIdKeyDictionary = WeakIdKeyDictionary()
_prefixes: WeakIdKeyDictionary = WeakIdKeyDictionary()


def linear_mix(model: Transformer, graph: Graph, outs, delta, w_RXS: Tensor, n_senders: int) -> Tensor:
    """(R, X, T, C): receiver_inputs' x = sum_{s < n_senders} out_s + w_s delta_s for X receivers, as plain_n + one
    matmul of the weights with the run's stacked deltas (module docstring). outs, delta: NodeOutputs of this run and
    of its corrupted-minus-reference deltas; each is stacked once, kept while the object lives."""
    stack = _stacks.get(delta)
    if stack is None:
        stack = _stacks[delta] = SenderStack(model, graph, delta)
    stack.fill(delta, n_senders)
    prefix = _prefixes.get(outs)
    if prefix is None:
        prefix = _prefixes[outs] = PlainPrefix(model, graph, outs)
    plain_RTC = prefix.stream(outs, n_senders)
    parts = [start for start, _ in stack.parts if start < n_senders]
    return _Mix.apply(stack, parts, plain_RTC, w_RXS, *[group for start, group in stack.parts if start < n_senders])


class _Mix(torch.autograd.Function):
    """plain (R, T, C) + w (R, X, S) @ stacked deltas, with the linear backward; saves the weights only."""

    @staticmethod
    def forward(ctx, stack: SenderStack, parts: list, plain_RTC: Tensor, w_RXS: Tensor, *deltas: Tensor) -> Tensor:
        R, X, S = w_RXS.shape
        T, C = stack.shape[1:]
        D_RSK = stack.buffer[:, :S]
        out_RXK = torch.baddbmm(plain_RTC.reshape(R, 1, T * C), w_RXS.to(D_RSK.dtype), D_RSK)
        # the stack's buffer (outside autograd), not the stack: the stack keeps its deltas, whose graph holds this
        # node, a cycle through autograd that no collector frees (every step's graph would stay)
        ctx.buffer, ctx.shape, ctx.parts, ctx.w_dtype = stack.buffer, stack.shape, parts, w_RXS.dtype
        ctx.save_for_backward(w_RXS)
        return out_RXK.view(R, X, T, C)

    @staticmethod
    def backward(ctx, grad_RXTC: Tensor):
        (w_RXS,) = ctx.saved_tensors
        parts = ctx.parts
        R, X, S = w_RXS.shape
        T, C = ctx.shape[1:]
        g_RXK = grad_RXTC.reshape(R, X, T * C)
        D_RSK = ctx.buffer[:, :S]
        needs = ctx.needs_input_grad
        grad_plain = g_RXK.sum(1).view(R, T, C) if needs[2] else None
        grad_w = torch.bmm(g_RXK, D_RSK.transpose(1, 2)).to(ctx.w_dtype) if needs[3] else None
        grads: list[Tensor | None] = [None] * len(parts)
        if any(needs[4:]):
            gD_RSK = torch.bmm(w_RXS.to(g_RXK.dtype).transpose(1, 2), g_RXK)
            ends = parts[1:] + [S]
            for i, (start, end) in enumerate(zip(parts, ends)):
                if needs[4 + i]:
                    grads[i] = gD_RSK[:, start:end].reshape(R, end - start, T, C)
        return (None, None, grad_plain, grad_w, *grads)

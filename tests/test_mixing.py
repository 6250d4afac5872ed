"""circuits/mixing.py: the receiver mix as one matmul over stacked sender deltas gives the per-sender form's logits
and gradients (float64 1e-10), for every family whose stream is a sum of per-sender terms, and is not used where it
would be wrong (a post-norm, or a gradient asked of W_O)."""

import pytest
import torch
from test_circuits import make_model, prompts

from headcount.circuits import forward
from headcount.circuits.forward import edge_stream, node_outputs
from headcount.circuits.graph import Graph

LINEAR = ("gpt2", "neox", "attn_only", "shortformer", "llama3", "llama_mqa_tied_biases_wide_heads")


def stream_and_grads(model, clean, corrupted, weights, reference, per_sender: bool, monkeypatch):
    """edge_stream's output and d(loss)/d(weights), through the matmul mix or (per_sender) the per-sender form."""
    with monkeypatch.context() as patch:
        if per_sender:
            patch.setattr(forward, "linear_stream", lambda model: False)
        w = weights.clone().requires_grad_()
        stream, _ = edge_stream(model, model.embed(clean), w, node_outputs(model, corrupted), reference)
        loss = (stream * torch.linspace(-1, 1, stream.shape[-1], dtype=stream.dtype)).pow(2).sum()
        loss.backward()
    return stream.detach(), w.grad


@pytest.mark.parametrize("family", LINEAR)
@pytest.mark.parametrize("with_reference", [False, True])
def test_the_matmul_mix_equals_the_per_sender_mix_with_its_gradients(family, with_reference, monkeypatch):
    model = make_model(family, torch.float64).requires_grad_(False)
    assert forward.linear_stream(model)
    clean, corrupted = prompts()
    g = torch.Generator().manual_seed(3)
    weights = torch.rand(2, len(Graph.of(model).edges), generator=g, dtype=torch.float64)  # two rows of weights
    reference = None
    if with_reference:  # EAP-IG's form: out + a (out' - ref), ref another run's outputs
        reference = node_outputs(model, prompts(seed=5)[0])
    fast = stream_and_grads(model, clean, corrupted, weights, reference, False, monkeypatch)
    slow = stream_and_grads(model, clean, corrupted, weights, reference, True, monkeypatch)
    torch.testing.assert_close(fast[0], slow[0], rtol=0, atol=1e-10)
    torch.testing.assert_close(fast[1], slow[1], rtol=0, atol=1e-10)
    assert slow[1].abs().max() > 1e-3  # the weights move the loss: the comparison is not of zeros


def test_the_matmul_mix_in_float32_is_within_rounding(monkeypatch):
    model = make_model("llama3", torch.float32).requires_grad_(False)
    clean, corrupted = prompts()
    weights = torch.rand(1, len(Graph.of(model).edges), generator=torch.Generator().manual_seed(4))
    fast = stream_and_grads(model, clean, corrupted, weights, None, False, monkeypatch)
    slow = stream_and_grads(model, clean, corrupted, weights, None, True, monkeypatch)
    torch.testing.assert_close(fast[0], slow[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fast[1], slow[1], rtol=1e-3, atol=1e-4)


def test_the_matmul_mix_is_not_used_with_a_post_norm_or_a_gradient_for_w_o():
    assert not forward.linear_stream(make_model("gemma3", torch.float64))  # attention post-norm: not linear
    model = make_model("llama3", torch.float64)  # its weights require grad
    assert not forward.linear_stream(model)
    with torch.no_grad():
        assert forward.linear_stream(model)  # no gradient asked: linear
    model.requires_grad_(False)
    model.blocks[0].attn.out.weight.requires_grad_(True)
    assert not forward.linear_stream(model)
    # and W_O's gradient is really there on the per-sender path
    clean, corrupted = prompts()
    weights = torch.full((1, len(Graph.of(model).edges)), 0.5, dtype=torch.float64)
    stream, _ = edge_stream(model, model.embed(clean), weights, node_outputs(model, corrupted))
    stream.sum().backward()
    assert model.blocks[0].attn.out.weight.grad.abs().max() > 0


def test_an_edge_pass_plans_for_the_stacked_deltas():
    """A weight row's planned bytes hold its stacked sender deltas (S, T, C) besides the run's outputs where the
    matmul mix runs, so passes of many rows fit the budget (a faithfulness curve on SmolLM2 ran out of memory when
    they were not counted)."""
    from headcount.circuits.passes import edge_unit_bytes, outputs_floats
    from headcount.config.model import AttentionConfig, ModelConfig
    from headcount.model.transformer import Transformer

    # deep and narrow, as SmolLM2 is for its width (30 layers, 301 senders): the stack outgrows a layer's work
    cfg = ModelConfig(n_layers=24, d_model=24, n_ctx=16, vocab_size=50, attn=AttentionConfig(n_heads=3), mlp=True)
    T, model = 7, Transformer(cfg).double()
    stack = len(Graph.of(model).senders) * T * model.cfg.d_model
    assert edge_unit_bytes(model, T, 1) >= (3 * outputs_floats(model, T) + stack) * 8


def test_a_run_s_stacked_deltas_are_freed_with_the_run():
    """The stacks are cached per run weakly: once a forward's outputs are gone, so is their stack (a faithfulness
    curve's passes would otherwise pile up every pass's (R, S, T*C) buffer)."""
    import gc

    from headcount.circuits import mixing

    model = make_model("llama3", torch.float64).requires_grad_(False)
    clean, corrupted = prompts()
    weights = torch.rand(1, len(Graph.of(model).edges), dtype=torch.float64)
    before = (len(mixing._stacks), len(mixing._prefixes))
    for _ in range(3):
        with torch.no_grad():
            edge_stream(model, model.embed(clean), weights, node_outputs(model, corrupted))
    gc.collect()
    assert (len(mixing._stacks), len(mixing._prefixes)) == before


def test_a_differentiated_run_s_stacks_are_freed_after_its_backward(monkeypatch):
    """With weights differentiated (an edge-pruning step), a later layer's deltas depend on earlier mixes: an autograd
    node that kept the stack (which keeps those deltas and so their graph, that node included) made a cycle through
    C++ that no collector frees, and every step's stack and graph stayed (a SmolLM2 edge-pruning run grew to 22 GB
    in 240 steps)."""
    import gc
    import weakref

    from headcount.circuits import mixing

    made = []
    build = mixing.SenderStack.__init__

    def recorded(self, *args):
        build(self, *args)
        made.append(weakref.ref(self))

    monkeypatch.setattr(mixing.SenderStack, "__init__", recorded)
    model = make_model("llama3", torch.float64).requires_grad_(False)
    clean, corrupted = prompts()
    weights = torch.rand(1, len(Graph.of(model).edges), dtype=torch.float64, requires_grad=True)
    stream, outs = edge_stream(model, model.embed(clean), weights, node_outputs(model, corrupted))
    stream.sum().backward()
    assert made and weights.grad is not None
    del stream, outs
    gc.collect()
    assert all(ref() is None for ref in made)

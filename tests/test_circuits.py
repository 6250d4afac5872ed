"""Circuits (src/headcount/circuits): the graph and its names, the exact edge-patched forward (plain forward with no
edge removed, the corrupted run with every edge removed, post-norm families included), path patching against a hook
loop on headcount's model and a float64 hand computation, EAP against central finite differences, exact edge scores
against path patching, circuits' faithfulness and the circuit figure."""

import matplotlib.colors
import matplotlib.image
import pytest
import torch
from family_cases import hf_model
from pretrained_helpers import converted

from headcount.circuits.attribution import (
    eap_ig_scores,
    eap_scores,
    edge_metric,
    edge_plan,
    exact_edge_scores,
    ranking_agreement,
)
from headcount.circuits.faithfulness import faithfulness, faithfulness_curve, prune, top_edges
from headcount.circuits.figure import draw_circuit, save_circuit
from headcount.circuits.forward import NodeOutputs, attention_contribution, edge_forward, node_outputs
from headcount.circuits.gradients import plain_outputs
from headcount.circuits.graph import Graph
from headcount.circuits.metric import PointMetric
from headcount.circuits.passes import PassPlan, plan_passes
from headcount.circuits.path_patching import path_patch
from headcount.config.model import AttentionConfig, ModelConfig
from headcount.errors import ConfigError
from headcount.model.intervention import reads
from headcount.model.transformer import Transformer
from headcount.pretrained.convert import convert

VOCAB = 50
TOL = {torch.float32: 1e-4, torch.float64: 1e-10}
NATIVE = {
    "gpt2": {"mlp": True},
    "neox": {"mlp": True, "parallel_residual": True, "positions": "rotary", "rotary_fraction": 0.5},
    "attn_only": {"mlp": False, "n_layers": 1},
    "shortformer": {"mlp": False, "positions": "shortformer"},  # the quickstart's: positions inside each head's q, k
}
CONVERTED = ("gemma3", "gemma2", "olmo2", "llama3")  # tests/family_cases.py, 16 tokens
HELPERS = ("neox_parallel", "llama_mqa_tied_biases_wide_heads")  # tests/pretrained_helpers.py: GPT-NeoX, MQA
FAMILIES = (*NATIVE, *CONVERTED, *HELPERS)


def make_model(family: str, dtype=torch.float64, seed: int = 0) -> Transformer:
    """A tiny random model of the family, its weights large enough that every head moves the metric."""
    if family in CONVERTED:
        return convert(hf_model(family, seed)).to(dtype).eval()
    if family in HELPERS:
        return converted(family, dtype)[1].eval()
    torch.manual_seed(seed)
    settings = {"n_layers": 2, **NATIVE[family]}
    cfg = ModelConfig(d_model=24, n_ctx=16, vocab_size=VOCAB, attn=AttentionConfig(n_heads=3), **settings)
    model = Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.4)
    return model.to(dtype).eval()


def prompts(batch: int = 2, T: int = 7, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, VOCAB, (batch, T), generator=g)
    corrupted = clean.clone()
    corrupted[:, :-1] = torch.randint(0, VOCAB, (batch, T - 1), generator=g)  # the last token kept
    return clean, corrupted


def logit_diff(logits_BV: torch.Tensor) -> torch.Tensor:
    return logits_BV[:, 3] - logits_BV[:, 7]


def close(a: torch.Tensor, b: torch.Tensor, dtype) -> bool:
    return torch.allclose(a, b, atol=TOL[dtype], rtol=TOL[dtype])


# --- the graph --------------------------------------------------------------------------------------------------------


def test_graph_counts_follow_the_block_wiring():
    sequential, parallel, attn_only = Graph([2, 2], True, False), Graph([2, 2], True, True), Graph([2, 2], False, False)
    # senders: emb, L0H0, L0H1, L0.mlp, L1H0, L1H1, L1.mlp; receivers: 6 head inputs per layer, each MLP, the logits
    assert [s.name for s in sequential.senders] == ["emb", "L0H0", "L0H1", "L0.mlp", "L1H0", "L1H1", "L1.mlp"]
    assert len(sequential.edges) == 6 * 1 + 3 + 6 * 4 + 6 + 7
    assert len(parallel.edges) == 6 * 1 + 1 + 6 * 4 + 4 + 7  # a parallel MLP does not read its own layer's heads
    assert len(attn_only.edges) == 6 * 1 + 6 * 3 + 5
    names = {e.name for e in sequential.edges}
    assert {"emb -> L0H1.v", "L0H1 -> L1H0.q", "L0H0 -> L0.mlp", "L1.mlp -> logits", "L0.mlp -> L1H1.k"} <= names
    assert "L1H0 -> L1.mlp" not in {e.name for e in parallel.edges}
    # the edges into one input are one contiguous block, in sender order
    for r, block in sequential.edge_slices.items():
        assert [e.receiver for e in sequential.edges[block]] == [r] * sequential.n_senders(r)
        assert [e.sender for e in sequential.edges[block]] == sequential.senders[: sequential.n_senders(r)]


@pytest.mark.parametrize(
    "name, message",
    [
        ("L0H7 -> L1H0.q", "no such node"),
        ("L0H1 -> L1H0.x", "suffix must be .q, .k or .v"),
        ("L0H1 -> L1H0", "read through .q, .k or .v"),
        ("L1H0 -> L0H1.k", "must come after its sender"),
        ("L1H0 -> L1H1.q", "must come after its sender"),
        ("L0H1 L1H0.q", "'sender -> receiver'"),
        ("logits -> L1H0.q", "send to nothing"),
        ("L0.mpl -> logits", "did you mean 'L0.mlp'"),
    ],
)
def test_bad_edge_names_get_one_line_errors(name, message):
    with pytest.raises(ConfigError, match=message) as error:
        Graph([3, 3], True, False).edge(name)
    assert "\n" not in str(error.value) and error.value.key == "circuits.edge"


def test_edge_names_round_trip():
    graph = Graph([3, 2], True, True)
    assert graph.edges_named([e.name for e in graph.edges]) == list(range(len(graph.edges)))


# --- the edge-patched forward -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("family", FAMILIES)
def test_edge_forward_spans_clean_to_corrupted(family, dtype):
    """No edge removed: the plain forward; every edge removed: the corrupted run; per row of a weight batch."""
    model = make_model(family, dtype)
    clean, corrupted = prompts(T=16 if family in CONVERTED else 7)
    n_edges = len(Graph.of(model).edges)
    weights = torch.stack([torch.zeros(n_edges), torch.ones(n_edges)]).to(dtype)
    with torch.no_grad():
        plain, _ = edge_forward(model, model.embed(clean))
        logits, _ = edge_forward(model, model.embed(clean), weights, node_outputs(model, corrupted))
        assert close(plain, model(clean), dtype)
        assert close(logits[:2], model(clean), dtype)
        assert close(logits[2:], model(corrupted), dtype)


@pytest.mark.parametrize("family", ["gpt2", "neox", "attn_only", "gemma2", "olmo2", "llama_mqa_tied_biases_wide_heads"])
def test_plain_outputs_are_the_edge_forwards_outputs(family):
    """EAP's one pass through the layers (gradients.plain_outputs) gives every sender output that node_outputs (the
    edge-patched forward with no edge touched) gives, float64."""
    model = make_model(family)
    clean, _ = prompts(T=16 if family in CONVERTED + HELPERS else 7)
    fast, reference = plain_outputs(model, clean), node_outputs(model, clean)
    for mine, theirs in zip([fast.emb, *fast.z, *fast.mlp], [reference.emb, *reference.z, *reference.mlp], strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("family", ["gemma3", "olmo2"])
def test_sum_of_heads_is_wrong_under_post_norms(family):
    """Where attention's output is normalised before it joins the stream, the sum of per-head contributions
    post_norm(z_h W_O^h) is not the layer's output: the edge-patched forward mixes z before the norm instead."""
    model = make_model(family)
    clean, _ = prompts(T=16)
    cache = reads(["attn.z"], [0])
    model(clean, cache)
    block, z_BTHD = model.blocks[0], cache.read("attn.z", 0)
    layer_out = block.ln_attn_out(block.attn.combine_heads(z_BTHD))
    per_head = torch.einsum("bthd,hdc->bthc", z_BTHD, block.attn.W_O)
    bias = 0 if block.attn.b_O is None else block.attn.b_O
    summed = block.ln_attn_out(per_head + bias / z_BTHD.shape[2]).sum(2)
    assert (layer_out - summed).abs().max() > 0.1
    # with no post-norm the shortcut is exact: the two definitions agree there
    llama = make_model("llama3")
    llama(clean, cache)
    z_BTHD, attn = cache.read("attn.z", 0), llama.blocks[0].attn
    per_head = torch.einsum("bthd,hdc->btc", z_BTHD, attn.W_O) + (0 if attn.b_O is None else attn.b_O)
    assert torch.allclose(attn.combine_heads(z_BTHD), per_head, atol=1e-12)


# --- path patching ----------------------------------------------------------------------------------------------------


def hook_path_patch(model: Transformer, clean, corrupted, senders: list[str], receivers: list[str]) -> float:
    """Wang et al.'s path patching by forward hooks and method patches on headcount's model, for receivers in one
    layer (or the logits): each receiver's input is its clean input plus, per sender layer, the change the senders'
    corrupted outputs make to what that layer adds to the stream (attention: post_norm(combine(z)) with the sender
    heads' z corrupted); everything else runs as it does."""
    graph = Graph.of(model)
    clean_cache, corrupted_cache = reads(["attn.z"], range(graph.n_layers)), reads(["attn.z"], range(graph.n_layers))
    mlp_outs = {}
    hooks = [
        (block.ln_mlp_out or block.mlp).register_forward_hook(
            lambda m, a, out, layer=layer: mlp_outs.update({layer: out})
        )
        for layer, block in enumerate(model.blocks)
        if block.mlp is not None
    ]
    model(clean, clean_cache)
    clean_mlp = dict(mlp_outs)
    model(corrupted, corrupted_cache)
    corrupted_mlp = dict(mlp_outs)
    for hook in hooks:
        hook.remove()
    receiver = graph.receiver(receivers[0])

    def delta_into(r) -> torch.Tensor:
        delta = torch.zeros_like(model.embed(clean))
        for s in senders:
            node = graph.node(s)
            if graph.senders.index(node) >= graph.n_senders(r):
                raise ValueError(f"{r.name} does not read {s}")
        if "emb" in senders:
            delta += model.embed(corrupted) - model.embed(clean)
        for layer, block in enumerate(model.blocks):
            heads = [
                graph.node(s).head for s in senders if graph.node(s).kind == "head" and graph.node(s).layer == layer
            ]
            if heads:
                z = clean_cache.read("attn.z", layer).clone()
                z[:, :, heads] = corrupted_cache.read("attn.z", layer)[:, :, heads]
                post = block.ln_attn_out or torch.nn.Identity()
                clean_z = clean_cache.read("attn.z", layer)
                delta += post(block.attn.combine_heads(z)) - post(block.attn.combine_heads(clean_z))
            if f"L{layer}.mlp" in senders:
                delta += corrupted_mlp[layer] - clean_mlp[layer]
        return delta

    patches = []
    if receiver.node.kind == "logits":
        patches.append(model.ln_f.register_forward_pre_hook(lambda m, a: (a[0] + delta_into(receiver),)))
    elif receiver.node.kind == "mlp":
        block = model.blocks[receiver.node.layer]
        patches.append(block.ln_mlp.register_forward_pre_hook(lambda m, a: (a[0] + delta_into(receiver),)))
    else:
        block = model.blocks[receiver.node.layer]
        attn, stream = block.attn, {}
        patches.append(block.ln_attn.register_forward_pre_hook(lambda m, a: stream.update(x=a[0])))
        project, per_query_head = attn.project, attn.per_query_head
        inputs = [graph.receiver(r) for r in receivers]

        def patched_project(x_normed):
            q, k, v = project(x_normed)
            q, x = q.clone(), stream["x"]  # (ln_attn's hook records each call's input: take the layer's first)
            for r in inputs:
                alt = project(block.ln_attn(x + delta_into(r)))
                if r.input == "q":
                    q[:, r.node.head] = alt[0][:, r.node.head]
                stream[r] = alt
            stream["k"], stream["v"] = k, v
            return q, k, v

        def patched_per_query_head(t):
            out = per_query_head(t).clone()
            which = "k" if t is stream["k"] else "v"
            for r in inputs:
                if r.input == which:
                    out[:, r.node.head] = per_query_head(stream[r][1 if which == "k" else 2])[:, r.node.head]
            return out

        attn.project, attn.per_query_head = patched_project, patched_per_query_head
    try:
        with torch.no_grad():
            patched_logits, clean_logits = model(clean), None
    finally:
        for p in patches:
            p.remove()
        if receiver.node.kind == "head":
            del attn.project, attn.per_query_head
    with torch.no_grad():
        clean_logits = model(clean)
    return (logit_diff(patched_logits[:, -1]).double().sum() - logit_diff(clean_logits[:, -1]).double().sum()).item()


PAIRS = {
    "gpt2": [
        (["L0H1"], ["L1H0.q"]),
        (["L0H0", "L0H2"], ["L1H1.k", "L1H2.v", "L1H0.v"]),
        (["emb", "L0.mlp"], ["L1H2.k"]),
        (["L0H1", "L0.mlp", "L1H0"], ["L1.mlp"]),
        (["L0H1"], ["logits"]),
        (["L1H2", "L0H0", "L1.mlp"], ["logits"]),
    ],
    "neox": [(["L0H1"], ["L1H0.q"]), (["emb"], ["L0.mlp"]), (["L0H2", "L0.mlp"], ["L1.mlp", "L1H1.v"][:1])],
    "attn_only": [(["emb"], ["L0H2.v"]), (["L0H1"], ["logits"]), (["emb", "L0H0"], ["logits"])],
    "shortformer": [(["L0H1"], ["L1H0.k"]), (["emb"], ["L1H2.q", "L1H1.v"]), (["L0H0", "L1H2"], ["logits"])],
    "gemma3": [
        (["L0H1"], ["L2H0.q"]),
        (["L0H1", "L1H3"], ["L2H0.k", "L2H2.v"]),
        (["L1H0", "L1H1"], ["L2H1.k"]),  # L2H0 shares L2H1's key/value head and stays clean
        (["L0.mlp", "L1H2"], ["L1.mlp"]),
        (["L2H3", "L0H0"], ["logits"]),
    ],
    "gemma2": [(["L0H2"], ["L1H1.v"]), (["emb", "L0.mlp"], ["L2H3.k", "L2H0.q"]), (["L1H0", "L2.mlp"], ["logits"])],
    "olmo2": [(["L0H1", "L0H3"], ["L1H2.q", "L1H0.k"]), (["L1H1"], ["L2.mlp"]), (["L2H0", "L1H1"], ["logits"])],
    "llama3": [
        (["L0H1"], ["L2H3.v"]),
        (["emb", "L1H2"], ["L2H1.k"]),
        (["L1H1", "L2H2"], ["logits"]),
        (["L0.mlp", "L1H0"], ["L2H0.q"]),  # an MLP sender: its change joins the stream too (issue 33's plant)
    ],
    "neox_parallel": [
        (["L0H1"], ["L1H0.q"]),
        (["L0H2", "L0.mlp"], ["L1H3.k", "L1H1.v"]),
        (["emb"], ["L0.mlp"]),
        (["L0H3"], ["L1.mlp"]),
        (["L1H2", "L0H0", "L1.mlp"], ["logits"]),
    ],
    "llama_mqa_tied_biases_wide_heads": [
        (["L0H1"], ["L1H2.k"]),  # one key/value head for all four: the other heads' keys stay clean
        (["emb", "L0.mlp"], ["L1H0.v", "L1H3.q"]),
        (["L0H1", "L1H1"], ["L1.mlp"]),
        (["L1H3"], ["logits"]),
    ],
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("family", FAMILIES)
def test_path_patching_equals_a_hook_loop(family, dtype):
    """Every pair of one batched pass equals the hook loop run pair by pair, heads' q, k and v, MLPs and logits."""
    model = make_model(family, dtype)
    clean, corrupted = prompts(T=16 if family in CONVERTED else 7)
    effects = path_patch(model, clean, corrupted, PAIRS[family], logit_diff)
    expected = [hook_path_patch(model, clean, corrupted, *pair) for pair in PAIRS[family]]
    expected = torch.tensor(expected, dtype=torch.float64)
    assert expected.abs().min() > 1e-5 and expected.abs().max() > 1e-2  # paths carry something: a broken patch shows
    assert close(effects, expected, dtype), (effects, expected)


def test_path_patching_equals_a_hand_computation():
    """float64, one attention-only layer with LayerNorms: the patched logits written out from the weights."""
    model = make_model("attn_only")
    clean, corrupted = prompts()
    attn, T = model.blocks[0].attn, clean.shape[1]

    def layer_norm(x, ln):
        return (x - x.mean(-1, keepdim=True)) / torch.sqrt(
            x.var(-1, unbiased=False, keepdim=True) + ln.eps
        ) * ln.weight + ln.bias

    def embed(ids):
        return model.tok_emb.weight[ids] + model.pos_emb.weight[:T]

    def head(h, xq, xk, xv):
        ln = model.blocks[0].ln_attn
        q = layer_norm(xq, ln) @ attn.W_Q[h] + attn.b_Q[h]
        k = layer_norm(xk, ln) @ attn.W_K[h] + attn.b_K[h]
        v = layer_norm(xv, ln) @ attn.W_V[h] + attn.b_V[h]
        scores = (q @ k.transpose(-1, -2)) / attn.head_dim**0.5
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        return scores.softmax(-1) @ v

    def logits(x, heads):
        out = sum(z @ attn.W_O[h] for h, z in enumerate(heads)) + attn.b_O
        return layer_norm(x + out, model.ln_f) @ model.lm_head.weight.T

    x, x_corrupted = embed(clean), embed(corrupted)
    z = [head(h, x, x, x) for h in range(3)]
    base = logits(x, z)
    through_l0h1 = logits(x, [z[0], head(1, x_corrupted, x_corrupted, x_corrupted), z[2]])
    into_value = logits(x, [z[0], z[1], head(2, x, x, x_corrupted)])
    with torch.no_grad():
        expected = torch.stack(
            [logit_diff(lg[:, -1]).sum() - logit_diff(base[:, -1]).sum() for lg in (through_l0h1, into_value)]
        )
        effects = path_patch(model, clean, corrupted, [(["L0H1"], ["logits"]), (["emb"], ["L0H2.v"])], logit_diff)
    assert expected.abs().min() > 1e-3
    torch.testing.assert_close(effects, expected, atol=1e-12, rtol=1e-12)
    # the logits alone as receivers (the pass starts after the last layer), and one pair per pass
    alone = path_patch(
        model, clean, corrupted, [(["L0H1"], ["logits"]), (["emb"], ["L0H2.v"])], logit_diff, pairs_per_pass=1
    )
    torch.testing.assert_close(alone, expected, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(path_patch(model, clean, corrupted, [(["L0H1"], ["logits"])], logit_diff), expected[:1])


def test_path_patching_fails_on_planted_errors(monkeypatch):
    """The hook-loop comparison catches a wrong sign and a path that leaks through a frozen head."""
    import headcount.circuits.path_patching as pp

    model = make_model("gemma3")
    clean, corrupted = prompts(T=16)
    pair = (["L0H1"], ["L2H0.q"])
    expected = torch.tensor([hook_path_patch(model, clean, corrupted, *pair)], dtype=torch.float64)
    assert close(path_patch(model, clean, corrupted, [pair], logit_diff), expected, torch.float64)

    with monkeypatch.context() as m:  # wrong sign: clean - corrupted
        minus = NodeOutputs.minus
        m.setattr(NodeOutputs, "minus", lambda self, other: minus(other, self))
        assert not close(path_patch(model, clean, corrupted, [pair], logit_diff), expected, torch.float64)

    def leaky_inputs(model, graph, clean_outs, corrupted_outs, pairs):
        """Receivers read a run in which the senders' corrupted outputs also reached the heads in between."""
        patched = {}
        for p, (senders, receivers) in enumerate(pairs):
            weights = torch.tensor([[float(e.sender in senders) for e in graph.edges]], dtype=torch.float64)
            _, run = edge_forward(model, clean_outs.emb, weights, corrupted_outs)
            for r in receivers:
                n = graph.n_senders(r)
                w = torch.zeros(n, dtype=torch.float64)
                w[[graph.senders.index(s) for s in senders]] = 1.0
                patched[p, r] = pp.stream_into(model, graph, run, corrupted_outs.minus(run), w.expand(2, 1, n), n)[:, 0]
        return patched

    with monkeypatch.context() as m:
        m.setattr(pp, "patched_inputs", leaky_inputs)
        with torch.no_grad():
            assert not close(path_patch(model, clean, corrupted, [pair], logit_diff), expected, torch.float64)


def test_path_patching_refuses_bad_pairs():
    model = make_model("gpt2")
    clean, corrupted = prompts()
    for pair, message in [
        ((["L1H0"], ["L0H1.q"]), "must come after its sender L1H0"),
        ((["L0H9"], ["logits"]), "no such node"),
        ((["L0H1"], ["L1H0.z"]), "suffix must be"),
        (([], ["logits"]), "needs a sender and a receiver"),
    ]:
        with pytest.raises(ConfigError, match=message):
            path_patch(model, clean, corrupted, [pair], logit_diff)


# --- edge attribution -------------------------------------------------------------------------------------------------


def sampled_edges(model: Transformer, count: int = 40) -> list[int]:
    """An even sample of the edges (every kind of sender and receiver input), to keep the tests to seconds."""
    n_edges = len(Graph.of(model).edges)
    return sorted(set(torch.linspace(0, n_edges - 1, count).round().long().tolist()))


@pytest.mark.parametrize("family", ["gpt2", "neox", "attn_only", "gemma3", "olmo2"])
def test_eap_equals_finite_differences(family):
    """float64: EAP is the derivative of the edge-patched metric in each edge's weight at 0 (post-norm layers
    included, through the exact per-layer definition), which central differences measure."""
    model = make_model(family)
    clean, corrupted = prompts(T=16 if family in CONVERTED else 7)
    eap = eap_scores(model, clean, corrupted, logit_diff)
    edges, eps = sampled_edges(model), 1e-5
    weights = torch.zeros(2 * len(edges), len(eap), dtype=torch.float64)
    for i, e in enumerate(edges):
        weights[2 * i, e], weights[2 * i + 1, e] = eps, -eps
    sums = edge_metric(model, clean, corrupted, weights, logit_diff)
    finite_differences = (sums[0::2] - sums[1::2]) / (2 * eps)
    assert finite_differences.abs().max() > 1e-2
    torch.testing.assert_close(eap[edges], finite_differences, atol=1e-7, rtol=1e-6)
    # and EAP is only a first-order estimate: the exact scores differ
    assert not torch.allclose(
        eap[edges], exact_edge_scores(model, clean, corrupted, logit_diff, edges=edges), atol=1e-3
    )


def test_eap_is_the_classic_formula_in_pre_norm_families():
    """(corrupted - clean sender output) . d metric / d receiver input, the receiver input's gradient taken by a
    hook on the plain model: for edges into the logits (the final norm's input) and into an MLP."""
    model = make_model("gpt2")
    clean, corrupted = prompts()
    graph, eap = Graph.of(model), eap_scores(model, clean, corrupted, logit_diff)
    clean_outs, corrupted_outs = node_outputs(model, clean), node_outputs(model, corrupted)
    grads = {}

    def receiver_input(name):
        """A pre-hook giving the module its own copy of its input, whose gradient is the receiver input's alone (the
        stream it is copied from also flows on past the MLP)."""

        def hook(module, args):
            grads[name] = args[0].clone()
            grads[name].retain_grad()
            return (grads[name],)

        return hook

    hooks = [model.ln_f.register_forward_pre_hook(receiver_input("logits"))]
    hooks.append(model.blocks[1].ln_mlp.register_forward_pre_hook(receiver_input("mlp")))
    logit_diff(model(clean)[:, -1]).double().sum().backward()
    for hook in hooks:
        hook.remove()
    attn = model.blocks[0].attn

    def head_out(h):
        return torch.einsum("btd,dc->btc", corrupted_outs.z[0][:, :, h] - clean_outs.z[0][:, :, h], attn.W_O[h])

    mlp_out = corrupted_outs.mlp[0] - clean_outs.mlp[0]
    assert mlp_out.abs().max() > 1e-2
    for name, delta, grad in [
        ("L0H1 -> logits", head_out(1), grads["logits"].grad),
        ("L0.mlp -> L1.mlp", mlp_out, grads["mlp"].grad),
        ("L0H2 -> L1.mlp", head_out(2), grads["mlp"].grad),
    ]:
        torch.testing.assert_close(eap[graph.edge_index[name]], (delta * grad).sum(), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("family", ["gpt2", "neox", "gemma3", "olmo2"])
def test_exact_edge_scores_equal_path_patching_of_each_edge(family, dtype):
    model = make_model(family, dtype)
    clean, corrupted = prompts(T=16 if family in CONVERTED else 7)
    graph, edges = Graph.of(model), sampled_edges(model, 24)
    exact = exact_edge_scores(model, clean, corrupted, logit_diff, edges=edges)
    pairs = [([graph.edges[e].sender.name], [graph.edges[e].receiver.name]) for e in edges]
    assert exact.abs().max() > 1e-2
    assert close(exact, path_patch(model, clean, corrupted, pairs, logit_diff), dtype)


def test_eap_ig_with_one_step_is_eap_and_refuses_fewer():
    """With one step the only interpolation is the clean input itself: EAP; more steps average other gradients."""
    model = make_model("gemma3")
    clean, corrupted = prompts(T=16)
    eap = eap_scores(model, clean, corrupted, logit_diff)
    torch.testing.assert_close(eap_ig_scores(model, clean, corrupted, logit_diff, steps=1), eap, atol=1e-12, rtol=1e-10)
    assert not torch.allclose(eap_ig_scores(model, clean, corrupted, logit_diff, steps=4), eap, atol=1e-3)
    for steps in (0, -2, 1.5):
        with pytest.raises(ConfigError, match="steps >= 1") as error:
            eap_ig_scores(model, clean, corrupted, logit_diff, steps=steps)
        assert error.value.key == "edge_attribution.steps"


def test_eap_ig_steps_are_the_interpolated_gradients():
    """Two steps: the mean of the gradients at the midpoint embedding and at the clean one, each dotted with the
    fixed corrupted-minus-clean outputs (taken here through edge_forward with a reference run, one step at a time)."""
    model = make_model("gpt2")
    clean, corrupted = prompts()
    clean_outs, corrupted_outs = node_outputs(model, clean), node_outputs(model, corrupted)
    per_step = []
    for t in (0.5, 1.0):
        weights = torch.zeros(1, len(Graph.of(model).edges), dtype=torch.float64, requires_grad=True)
        emb = corrupted_outs.emb + t * (clean_outs.emb - corrupted_outs.emb)
        logits, _ = edge_forward(model, emb, weights, corrupted_outs, reference=clean_outs)
        (grad,) = torch.autograd.grad(logit_diff(logits[:, -1]).double().sum(), weights)
        per_step.append(grad[0])
    expected = (per_step[0] + per_step[1]) / 2
    torch.testing.assert_close(eap_ig_scores(model, clean, corrupted, logit_diff, steps=2), expected)


def weight_gradients(model: Transformer, clean, corrupted, steps: int | None = None) -> torch.Tensor:
    """The definition EAP and EAP-IG compute: the gradient of the edge-patched metric in the edge weights at 0
    (edge_forward with differentiable weights); EAP-IG its mean at the interpolated inputs (clean run as reference)."""
    clean_outs, corrupted_outs = node_outputs(model, clean), node_outputs(model, corrupted)
    points = [1.0] if steps is None else [k / steps for k in range(1, steps + 1)]
    total = 0
    for t in points:
        emb = model.embed(clean) if steps is None else corrupted_outs.emb + t * (clean_outs.emb - corrupted_outs.emb)
        weights = emb.new_zeros(1, len(Graph.of(model).edges), requires_grad=True)
        reference = None if steps is None else clean_outs
        logits, _ = edge_forward(model, emb, weights, corrupted_outs, reference=reference)
        total = total + torch.autograd.grad(logit_diff(logits[:, -1]).double().sum(), weights)[0][0].double()
    return total / len(points)


FAST_FAMILIES = ("gpt2", "neox", "llama3", "llama_mqa_tied_biases_wide_heads", "gemma2", "gemma3", "olmo2")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("family", FAST_FAMILIES)
def test_eap_and_eap_ig_equal_the_weight_gradients(family, dtype):
    """EAP and EAP-IG, dot products of sender deltas with one backward's receiver gradients (gradients.py), equal the
    gradients of the edge-patched forward in every edge weight (float64 to 1e-10, float32 within rounding): pre-norm,
    parallel, grouped- and multi-query attention, and post-norm layers (Gemma 2/3, OLMo 2), where a head's delta
    passes the post-norm's Jacobian."""
    model = make_model(family, dtype)
    clean, corrupted = prompts(T=16 if family in CONVERTED + HELPERS else 7)
    tol = {"atol": 1e-12, "rtol": 1e-10} if dtype == torch.float64 else {"atol": 1e-4, "rtol": 1e-3}
    eap = weight_gradients(model, clean, corrupted)
    assert eap.abs().max() > 1e-2
    fast = eap_scores(model, clean, corrupted, logit_diff)
    assert not fast.requires_grad  # plain numbers, though the model's parameters require gradients
    torch.testing.assert_close(fast, eap, **tol)
    eap_ig = weight_gradients(model, clean, corrupted, steps=3)
    torch.testing.assert_close(eap_ig_scores(model, clean, corrupted, logit_diff, 3), eap_ig, **tol)


@pytest.mark.parametrize("family", ["llama3", "gemma3", "olmo2"])
def test_weight_gradient_comparison_catches_planted_errors(family, monkeypatch):
    """Each head's delta through its neighbour's W_O fails everywhere; a head input's gradient not taken back through
    the layer's input norm fails where there is one (not OLMo 2); the post-norm's Jacobian skipped fails where
    attention has a post-norm (Gemma 3, OLMo 2) and changes nothing where it has none (Llama 3)."""
    import headcount.circuits.attribution as attribution
    import headcount.circuits.gradients as gradients

    model = make_model(family)
    clean, corrupted = prompts(T=16)
    definition = weight_gradients(model, clean, corrupted)
    sender_rows = attribution.sender_rows

    def neighbours_W_O(model, delta):
        return sender_rows(model, NodeOutputs(delta.emb, [z.roll(1, dims=2) for z in delta.z], delta.mlp))

    monkeypatch.setattr(attribution, "sender_rows", neighbours_W_O)
    assert not torch.allclose(eap_scores(model, clean, corrupted, logit_diff), definition, atol=1e-6)
    monkeypatch.setattr(attribution, "sender_rows", sender_rows)
    input_norm = not isinstance(model.blocks[0].ln_attn, torch.nn.Identity)  # OLMo 2 normalises outputs only
    assert input_norm == (family != "olmo2")
    with monkeypatch.context() as patched:  # a head's gradient read at its normed input, the input norm skipped
        patched.setattr(gradients, "before_norm", lambda norm, at, grads: grads)
        skipped = eap_scores(model, clean, corrupted, logit_diff)
        assert torch.allclose(skipped, definition, atol=1e-9) == (not input_norm)
    monkeypatch.setattr(attribution, "through_norm", lambda norm, at, grads: grads)
    skipped = eap_scores(model, clean, corrupted, logit_diff)
    post_norm = any(block.ln_attn_out is not None for block in model.blocks)
    assert post_norm == (family != "llama3")
    assert torch.allclose(skipped, definition, atol=1e-9) == (not post_norm)


# --- circuits and faithfulness ----------------------------------------------------------------------------------------


def test_faithfulness_spans_zero_to_one_and_reads_the_edge_patched_metric():
    model = make_model("gpt2")
    clean, corrupted = prompts()
    graph = Graph.of(model)
    everything, dropped = set(range(len(graph.edges))), graph.edge_index["L0H1 -> L1H0.k"]
    values = faithfulness(model, clean, corrupted, [everything, set(), everything - {dropped}], logit_diff)
    with torch.no_grad():
        clean_m, corrupted_m = (logit_diff(model(ids)[:, -1]).double().sum() for ids in (clean, corrupted))
    removed_alone = exact_edge_scores(model, clean, corrupted, logit_diff, edges=[dropped])[0]
    torch.testing.assert_close(values[:2], torch.tensor([1.0, 0.0], dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(values[2], 1 + removed_alone / (clean_m - corrupted_m), atol=1e-10, rtol=1e-10)


def test_pruning_keeps_only_paths_from_emb_to_logits():
    graph = Graph([2, 2], True, False)
    named = graph.edges_named
    kept = named(["emb -> L0H1.k", "L0H1 -> L1H0.q", "L1H0 -> logits"])
    dangling = named(["L0H0 -> L1H1.v", "emb -> L1H1.q", "L0.mlp -> L1.mlp"])  # L0H0 unreached; L1H1, L1.mlp dead ends
    assert prune(graph, set(kept + dangling)) == set(kept)
    assert prune(graph, set(dangling)) == set()
    scores = torch.zeros(len(graph.edges))
    scores[kept], scores[dangling[0]] = torch.tensor([3.0, -2.0, 1.0]), 5.0
    assert top_edges(graph, scores, 4) == set(kept)  # the largest |score| is pruned away
    with pytest.raises(ConfigError, match="circuits.size"):
        top_edges(graph, scores, len(graph.edges) + 1)


def test_faithfulness_curve_covers_methods_and_random_circuits():
    model = make_model("gpt2")
    clean, corrupted = prompts()
    n_edges = len(Graph.of(model).edges)
    exact = exact_edge_scores(model, clean, corrupted, logit_diff)
    curve = faithfulness_curve(model, clean, corrupted, {"exact": exact}, [0, 10, n_edges], logit_diff, random_draws=3)
    assert len(curve) == 3 + 3 * 3 and set(curve["method"]) == {"exact", "random"}
    full = curve[curve["n"] == n_edges]
    assert (full["edges"] == n_edges).all() and torch.allclose(
        torch.tensor(full["faithfulness"].values), torch.ones(4, dtype=torch.float64)
    )
    assert (curve[curve["n"] == 0]["faithfulness"].abs() < 1e-12).all()
    top10 = curve[(curve["method"] == "exact") & (curve["n"] == 10)]["faithfulness"].item()
    random10 = curve[(curve["method"] == "random") & (curve["n"] == 10)]["faithfulness"]
    assert top10 > random10.max()


def test_circuit_figure_draws_each_edge_with_its_input_colour(tmp_path):
    model = make_model("gpt2")
    graph = Graph.of(model)
    circuit = set(
        graph.edges_named(["emb -> L0H1.k", "L0H1 -> L1H0.q", "L0H1 -> L1H2.v", "L1H0 -> L1.mlp", "L1.mlp -> logits"])
    )
    weights = torch.linspace(0.1, 1.0, len(graph.edges))
    fig = draw_circuit(graph, circuit, weights)
    arrows = {p.get_gid(): p for p in fig.axes[0].patches if p.get_gid()}
    assert set(arrows) == {graph.edges[i].name for i in circuit}
    colours = {name: matplotlib.colors.to_hex(p.get_edgecolor()) for name, p in arrows.items()}
    assert colours["emb -> L0H1.k"] == matplotlib.colors.to_hex("tab:orange")
    assert colours["L0H1 -> L1H0.q"] == matplotlib.colors.to_hex("tab:blue")
    assert colours["L0H1 -> L1H2.v"] == matplotlib.colors.to_hex("tab:green")
    assert colours["L1.mlp -> logits"] == matplotlib.colors.to_hex("tab:gray")
    widths = {name: p.get_linewidth() for name, p in arrows.items()}
    assert widths["L1.mlp -> logits"] > widths["emb -> L0H1.k"]  # a later edge has a larger weight here
    labels = {t.get_text() for t in fig.axes[0].texts}
    assert {"emb", "L0H1", "L1H2", "L1.mlp", "logits"} <= labels
    path = save_circuit(graph, circuit, tmp_path / "circuit.png", weights)
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_pre_norm_shortcut_equals_the_general_mix():
    """Without a post-norm attention's contribution is mixed per head after W_O (linear); with an identity post-norm
    the general path mixes z before combining: the two agree."""
    model = make_model("llama3")
    clean, corrupted = prompts(T=16)
    outs, corrupted_outs = node_outputs(model, clean), node_outputs(model, corrupted)
    w_BXH = torch.rand(2, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    block, dz = model.blocks[1], corrupted_outs.minus(outs).z[1]
    shortcut = attention_contribution(block, outs.z[1], dz, w_BXH)
    block.ln_attn_out = torch.nn.Identity()
    torch.testing.assert_close(attention_contribution(block, outs.z[1], dz, w_BXH), shortcut, atol=1e-12, rtol=1e-12)


def test_right_padded_prompts_score_as_they_score_alone():
    """Score positions read each prompt where it ends: a right-padded batch sums the prompts' own scores."""
    model = make_model("gemma3")
    clean, corrupted = prompts(T=16)
    short = 9
    padded_clean, padded_corrupted = clean.clone(), corrupted.clone()
    padded_clean[0, short:], padded_corrupted[0, short:] = 0, 5  # the padding differs too: it must not matter
    positions = torch.tensor([short - 1, 15])
    pair = [(["L0H1", "L1.mlp"], ["L2H0.k", "L2H3.q"])]
    alone = [(clean[:1, :short], corrupted[:1, :short]), (clean[1:], corrupted[1:])]
    torch.testing.assert_close(
        path_patch(model, padded_clean, padded_corrupted, pair, logit_diff, positions),
        sum(path_patch(model, c, x, pair, logit_diff) for c, x in alone),
    )
    torch.testing.assert_close(
        eap_scores(model, padded_clean, padded_corrupted, logit_diff, positions),
        sum(eap_scores(model, c, x, logit_diff) for c, x in alone),
    )


# --- passes sized to a memory budget ----------------------------------------------------------------------------------


def answer_logprob(logits_PV: torch.Tensor, answer_P: torch.Tensor) -> torch.Tensor:
    return logits_PV.log_softmax(-1).gather(1, answer_P[:, None])[:, 0]


def several_points(batch: int, T: int, seed: int = 2) -> tuple[torch.Tensor, PointMetric]:
    """A (B, T) mask with 1 to 4 score points per prompt, and a metric that reads each point's own answer."""
    g = torch.Generator().manual_seed(seed)
    where = torch.zeros(batch, T, dtype=torch.bool)
    for b in range(batch):
        where[b, torch.randperm(T, generator=g)[: 1 + b % 4]] = True
    answers = torch.randint(0, VOCAB, (int(where.sum()),), generator=g)
    return where, PointMetric(answer_logprob, answers)


def every_edge_evaluation(model: Transformer, clean, corrupted, where, metric, budget: int | None) -> dict:
    graph = Graph.of(model)
    edges = sampled_edges(model, 12)
    pairs = [(["L0H1"], ["L1H0.k", "L1H2.q"]), (["emb", "L0H0"], ["logits"]), (["L0H2"], ["L1H1.v"])]
    circuits = [set(edges), set(range(len(graph.edges))) - set(edges)]
    args = (model, clean, corrupted)
    return {
        "exact": exact_edge_scores(*args, metric, where, edges=edges, memory_budget=budget),
        "eap": eap_scores(*args, metric, where, memory_budget=budget),
        "eap_ig": eap_ig_scores(*args, metric, 3, where, memory_budget=budget),
        "path_patching": path_patch(*args, pairs, metric, where, memory_budget=budget),
        "faithfulness": faithfulness(*args, circuits, metric, where, memory_budget=budget),
    }


@pytest.mark.parametrize("family", ["gpt2", "gemma3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_passes_of_one_row_of_one_example_equal_one_pass(family, dtype, monkeypatch):
    """A budget too small for anything splits every evaluation into passes of one weight row (pair, step) of one
    example; every number equals the one-pass result: float64 to 1e-12, float32 within rounding. Several points per
    prompt, each with its own answer (a PointMetric), so each pass reads its own points' answers."""
    import headcount.circuits.attribution as attribution

    model = make_model(family, dtype)
    clean, corrupted = prompts(batch=5, T=16 if family in CONVERTED else 7)
    where, metric = several_points(*clean.shape)
    whole = every_edge_evaluation(model, clean, corrupted, where, metric, 2**40)
    passes = []
    stream = attribution.edge_stream
    monkeypatch.setattr(
        attribution, "edge_stream", lambda model, emb, *a, **k: passes.append(emb.shape) or stream(model, emb, *a, **k)
    )
    split = every_edge_evaluation(model, clean, corrupted, where, metric, 1)
    assert {shape[-3] for shape in passes} == {1} and len(passes) > 5 * 13  # one example per pass, each row alone
    tol = 1e-12 if dtype == torch.float64 else 1e-4
    for name, value in whole.items():
        torch.testing.assert_close(split[name], value, atol=tol, rtol=tol, msg=name)
    assert split["exact"].abs().max() > 1e-2 and split["path_patching"].abs().max() > 1e-2


def test_a_split_is_the_same_additions_every_time():
    """The metric is summed over all points in point order whatever the passes: a split gives the same bits every
    time, and other splits differ only where a pass's size changes the rounding of the per-point values."""
    model = make_model("neox")
    clean, corrupted = prompts(batch=6)
    where, metric = several_points(*clean.shape)
    edges = sampled_edges(model, 10)
    splits = [(None, 2**40), (3, 1), (1, 2**40), (None, 1), (3, 1)]
    results = [
        exact_edge_scores(model, clean, corrupted, metric, where, edges=edges, rows_per_pass=rows, memory_budget=b)
        for rows, b in splits
    ]
    assert torch.equal(results[1], results[4])
    for result in results[1:]:
        torch.testing.assert_close(result, results[0], atol=1e-13, rtol=1e-13)


def test_passes_fit_the_budget():
    """The planner's largest pass stays under the budget whenever one row of one example fits it, holds everything
    when the budget is ample, and splits examples before rows only when one row of every example does not fit."""
    model = make_model("gpt2", torch.float32)
    where = torch.ones(40, 16, dtype=torch.bool)
    unit = edge_plan(model, where, 1, 2**40).unit_bytes
    for budget in [unit * k for k in (2, 5, 40, 41, 100, 1000, 5000)]:
        for grad, reference, rows in [(False, False, 300), (True, False, 1), (True, True, 5)]:
            plan = edge_plan(model, where, rows, budget, grad=grad, reference=reference)
            if plan.unit_bytes + plan.example_bytes <= budget:
                assert plan.bytes <= budget and (plan.examples == 40 or plan.rows == 1)
            else:
                assert (plan.rows, plan.examples) == (1, 1)
    ample = edge_plan(model, where, 300, 2**40)
    assert (ample.rows, ample.examples) == (300, 40)
    assert edge_plan(model, where, 300, 1).bytes > 1  # nothing fits: one row of one example
    assert edge_plan(model, where, 300, 2**40, grad=True).unit_bytes > ample.unit_bytes  # autograd keeps every layer
    assert plan_passes(10, 5, 100, 8, 1000, rows=7) == PassPlan(7, 8, 10, 5)  # rows as given, examples that fit


def test_a_plain_metric_that_reads_per_point_data_fails_loudly_when_examples_split():
    model = make_model("gpt2")
    clean, corrupted = prompts(batch=4)
    answers = torch.arange(4)
    per_prompt = lambda logits_PV: logits_PV[torch.arange(4), answers]  # noqa: E731
    eap_scores(model, clean, corrupted, per_prompt)  # one pass: fine
    with pytest.raises((ValueError, IndexError)):
        eap_scores(model, clean, corrupted, per_prompt, memory_budget=1)


def test_ranking_agreement():
    exact = torch.tensor([5.0, -4.0, 3.0, 0.5, 0.1])
    agreement = ranking_agreement(torch.tensor([-5.0, 4.0, 3.0, 0.5, 0.1]), exact, 2)  # signs do not matter
    assert agreement == {"spearman": pytest.approx(1.0), "top_k_recall": 1.0}
    swapped = ranking_agreement(torch.tensor([5.0, 0.2, 3.0, 0.5, 4.0]), exact, 2)
    assert swapped["top_k_recall"] == 0.5 and swapped["spearman"] < 1
    with pytest.raises(ConfigError, match="verify_top_k"):
        ranking_agreement(exact, exact, 6)

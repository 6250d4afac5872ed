"""Edges through cross-attention (circuits/seq2seq_graph.py, seq2seq_forward.py, seq2seq_attribution.py): the graph's
edges by hand; no edge removed is the model, every edge removed the corrupted run (float32, float64; pre-LN, grouped
and summed cross heads, post-LN); exact edge scores equal an independent implementation with hooks at the model's own
sites (float64); EAP equals central finite differences of the edge-patched metric and EAP-IG the mean of those at its
interpolated embeddings; what is not defined yet is refused by name."""

import pytest
import torch
from torch import Tensor

from headcount.circuits import Graph, PointMetric, path_patch
from headcount.circuits.seq2seq_attribution import (
    seq2seq_eap_ig_scores,
    seq2seq_eap_scores,
    seq2seq_edge_metric,
    seq2seq_exact_edge_scores,
    seq2seq_faithfulness,
)
from headcount.circuits.seq2seq_forward import seq2seq_edge_logits, seq2seq_outputs, seq2seq_stream
from headcount.circuits.seq2seq_graph import Seq2SeqGraph
from headcount.circuits.seq2seq_path_patching import seq2seq_path_patch
from headcount.config.model import AttentionConfig, ModelConfig
from headcount.errors import ConfigError
from headcount.model.encoder_decoder import EncoderDecoder, StackIntervention

V, S, T, B = 20, 6, 5, 3


def config(**changes) -> ModelConfig:
    settings = {
        "n_layers": 2,
        "encoder_layers": 2,
        "d_model": 16,
        "n_ctx": 12,
        "vocab_size": V,
        "attn": AttentionConfig(n_heads=2),
        "cross_attn": AttentionConfig(n_heads=3, head_dim=4),
        "mlp": True,
        "positions": "learned",
    }
    return ModelConfig(**{**settings, **changes})


CONFIGS = {
    "pre_ln": config(),
    "grouped_cross_sum": config(
        positions="sinusoidal",
        cross_attn=AttentionConfig(n_heads=4, head_dim=5, n_kv_heads=2, combine="sum", qkv_bias=True),
    ),
    "post_ln": config(pre_norm=False, post_ln=True, final_norm=False, embed_norm=True),
}
DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: 1e-5, torch.float64: 1e-12}


def make(name: str = "pre_ln", dtype=torch.float64) -> EncoderDecoder:
    torch.manual_seed(0)
    model = EncoderDecoder(CONFIGS[name]).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.4)
    return model


def ids(seed: int, length: int) -> Tensor:
    return torch.randint(0, V, (B, length), generator=torch.Generator().manual_seed(seed))


SRC, TGT, SRC2, TGT2 = ids(1, S), ids(2, T), ids(3, S), ids(4, T)
NEXT = ids(5, T)  # the teacher-forced answers: position t predicts NEXT[:, t]
POINTS = torch.ones(B, T, dtype=torch.bool)
POINTS[0, -1] = POINTS[2, :2] = False


def logprob(logits_PV: Tensor, answers_P: Tensor) -> Tensor:
    return logits_PV.log_softmax(-1).gather(1, answers_P[:, None])[:, 0]


METRIC = PointMetric(logprob, NEXT[POINTS])


def test_the_graph_reads_across_stacks_only_through_cross_keys_and_values():
    graph = Seq2SeqGraph.of(make())
    # senders: enc 1 + 2 * (2 heads + mlp) = 7; dec 1 + 2 * (2 + 3 cross + mlp) = 13
    assert [len(graph.senders), graph.n_enc_senders] == [20, 7]
    enc_edges = 3 * 2 * 1 + 1 * 3 + 3 * 2 * 4 + 1 * 6  # layer 0 heads, L0 mlp, layer 1 heads, L1 mlp
    cross_kv = 2 * 3 * 2 * 7  # two layers of three heads' k and v, each from the 7 encoder senders
    dec_edges = (3 * 2 * 1 + 3 * 3 + 1 * 6) + (3 * 2 * 7 + 3 * 9 + 1 * 12) + 13  # L0, L1, the logits
    assert len(graph.edges) == enc_edges + cross_kv + dec_edges == 238
    assert graph.n_encoder_edges == enc_edges
    for name in [
        "enc.L0H1 -> cross.L1H0.k",
        "enc.L1.mlp -> cross.L0H2.v",
        "enc.emb -> enc.L1H0.k",
        "dec.L0H1 -> cross.L0H0.q",
        "cross.L0H2 -> dec.L1H0.v",
        "cross.L1H2 -> dec.L1.mlp",
        "dec.L1.mlp -> logits",
    ]:
        assert graph.edges[graph.edge_index[name]].name == graph.edge(name).name == name
    for bad in [
        "enc.L0H0 -> dec.L1H0.q",  # the decoder's stream holds no encoder sender
        "enc.L1H0 -> logits",
        "dec.L0H0 -> cross.L0H0.k",  # a cross head's keys read the encoder alone
        "cross.L1H0 -> cross.L1H1.q",  # a cross head's query reads its layer's self-attention, not its cross heads
        "dec.L1H0 -> dec.L0H0.q",
        "enc.L2H0 -> cross.L0H0.k",
        "dec.L0H0 -> cross.L0H0.z",
        "dec.L0H0 cross.L0H0.q",
    ]:
        with pytest.raises(ConfigError) as error:
            graph.edge(bad)
        assert "\n" not in str(error.value) and bad.split(" ")[0] in str(error.value)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_no_edge_removed_is_the_model_and_every_edge_removed_the_corrupted_run(name, dtype):
    model = make(name, dtype)
    graph = Seq2SeqGraph.of(model)
    weights = torch.zeros(2, len(graph.edges), dtype=dtype)
    weights[1] = 1
    corrupted = seq2seq_outputs(model, SRC2, TGT2)
    with torch.no_grad():
        logits = seq2seq_edge_logits(model, SRC, TGT, weights, corrupted).view(2, B, T, V)
        plain = seq2seq_edge_logits(model, SRC, TGT)
        torch.testing.assert_close(plain, model(SRC, TGT), rtol=0, atol=TOL[dtype])
        torch.testing.assert_close(logits[0], model(SRC, TGT), rtol=0, atol=TOL[dtype])
        torch.testing.assert_close(logits[1], model(SRC2, TGT2), rtol=0, atol=TOL[dtype])


def hooked_metric(model: EncoderDecoder, edge: str) -> float:
    """M with `edge` removed, by hooks at the model's own sites (a pre-LN model's receiver input is a sum of its
    senders' outputs, so removing s -> r adds s's corrupted-minus-clean term to r's input alone): a head's q/k/v
    input (attn.q_input, ...), an MLP's input, the final stream; a cross head's z recomputed by hand at cross.z from
    its patched query stream or its patched copy of the encoder's output through the encoder's final norm."""
    clean, corrupted = reads(model, SRC, TGT), reads(model, SRC2, TGT2)
    sender, receiver = [part.strip() for part in edge.split("->")]
    delta = term(model, sender, corrupted) - term(model, sender, clean)
    stack, rest = receiver.split(".", 1) if receiver != "logits" else ("dec", "logits")
    hooks = []
    if receiver == "logits":
        hooks.append((f"dec.blocks.{model.cfg.n_layers - 1}.resid_post", lambda x, site: x + delta))
    elif rest.endswith(".mlp"):
        hooks.append((f"{stack}.blocks.{rest[1]}.mlp.input", lambda x, site: x + delta))
    elif stack != "cross":
        layer, head, which = int(rest[1]), int(rest[3]), rest[-1]

        def add(x, site, head=head):
            x = x.clone()
            x[:, :, head] += delta
            return x

        hooks.append((f"{stack}.blocks.{layer}.attn.{which}_input", add))
    else:
        layer, head, which = int(rest[1]), int(rest[3]), rest[-1]
        block = model.decoder.blocks[layer]
        mid = {}
        hooks.append((f"dec.blocks.{layer}.resid_pre", lambda x, site: mid.__setitem__("pre", x)))
        hooks.append((f"dec.blocks.{layer}.attn_out", lambda x, site: mid.__setitem__("attn", x)))
        memory = model.memory_of(clean["enc.final"])
        patched = model.memory_of(clean["enc.final"] + delta) if which in "kv" else memory

        def cross_z(z, site):
            cross = block.cross
            g = cross.kv_head_of[head]
            query = mid["pre"] + mid["attn"] + (delta if which == "q" else 0)
            q = block.ln_cross(query) @ cross.W_Q[head] + (0 if cross.b_Q is None else cross.b_Q[head])
            keys = (patched if which == "k" else memory) @ cross.W_K[g] + (0 if cross.b_K is None else cross.b_K[g])
            values = (patched if which == "v" else memory) @ cross.W_V[g] + (0 if cross.b_V is None else cross.b_V[g])
            pattern = ((q @ keys.transpose(1, 2)) * cross.head_dim**-0.5).softmax(-1)
            z = z.clone()
            z[:, :, head] = pattern @ values
            return z

        hooks.append((f"dec.blocks.{layer}.cross.z", cross_z))
    with torch.no_grad():
        logits = model(SRC, TGT, intervention=StackIntervention(hooks))
    return float(logprob(logits[POINTS], NEXT[POINTS]).double().sum())


def reads(model: EncoderDecoder, src: Tensor, tgt: Tensor) -> dict[str, Tensor]:
    """A run's sender outputs and the encoder's final stream, read by hooks that change nothing."""
    found: dict[str, Tensor] = {}
    hooks = []
    for stack, n_layers in (("enc", model.cfg.encoder_layers), ("dec", model.cfg.n_layers)):
        for layer in range(n_layers):
            for site in ["attn.z", "mlp_out"] + (["cross.z"] if stack == "dec" else []):
                name = f"{stack}.blocks.{layer}.{site}"
                hooks.append((name, lambda x, s, name=name: found.__setitem__(name, x)))
    last = f"enc.blocks.{model.cfg.encoder_layers - 1}.resid_post"
    hooks.append((last, lambda x, s: found.__setitem__("enc.final", x)))
    with torch.no_grad():
        model(src, tgt, intervention=StackIntervention(hooks))
        found["enc.emb"], found["dec.emb"] = model.encoder.embed(src), model.decoder.embed(tgt)
    return found


def term(model: EncoderDecoder, sender: str, run: dict[str, Tensor]) -> Tensor:
    """A sender's output as it joins its stream: emb, an MLP's output, a head's z_h W_O^h."""
    stack, rest = sender.split(".", 1)
    if rest == "emb":
        return run[f"{stack}.emb"]
    layer = int(rest[1])
    if rest.endswith(".mlp"):
        return run[f"{stack}.blocks.{layer}.mlp_out"]
    head = int(rest[3])
    blocks = model.encoder.blocks if stack == "enc" else model.decoder.blocks
    attn = blocks[layer].cross if stack == "cross" else blocks[layer].attn
    site = "cross.z" if stack == "cross" else "attn.z"
    return run[f"{'enc' if stack == 'enc' else 'dec'}.blocks.{layer}.{site}"][:, :, head] @ attn.W_O[head]


# every kind of sender into every kind of receiver input
EDGES = [
    "enc.emb -> enc.L1H0.k",
    "enc.L0H1 -> enc.L1H1.q",
    "enc.L1H0 -> enc.L1.mlp",
    "enc.L0.mlp -> enc.L1H0.v",
    "enc.emb -> cross.L0H1.v",
    "enc.L0H1 -> cross.L1H0.k",
    "enc.L1.mlp -> cross.L0H2.v",
    "enc.L1H1 -> cross.L1H2.k",
    "dec.emb -> dec.L0H1.v",
    "dec.L0H0 -> cross.L0H1.q",
    "dec.L0.mlp -> cross.L1H0.q",
    "cross.L0H2 -> dec.L1H0.k",
    "cross.L0H0 -> dec.L1H1.q",
    "cross.L1H1 -> dec.L1.mlp",
    "dec.L1H0 -> dec.L1.mlp",
    "cross.L1H2 -> logits",
    "dec.L1H1 -> logits",
    "enc.L1H0 -> cross.L0H0.k",
]


@pytest.mark.parametrize("name", ["pre_ln", "grouped_cross_sum"])
def test_exact_edge_scores_equal_hooks_at_the_models_sites(name):
    model = make(name)
    graph = Seq2SeqGraph.of(model)
    edges = [e.replace("cross.L1H2.k", "cross.L1H3.k") if name != "pre_ln" else e for e in EDGES]
    chosen = graph.edges_named(edges)
    scores = seq2seq_exact_edge_scores(model, SRC, TGT, (SRC2, TGT2), METRIC, POINTS, edges=chosen, rows_per_pass=5)
    with torch.no_grad():
        clean = float(logprob(model(SRC, TGT)[POINTS], NEXT[POINTS]).double().sum())
    by_hooks = torch.tensor([hooked_metric(model, edge) - clean for edge in edges], dtype=torch.float64)
    torch.testing.assert_close(scores, by_hooks, rtol=0, atol=1e-10)
    assert (scores.abs() > 1e-8).all()  # every edge moves the metric by far more than the tolerance


def finite_differences(model, weights_at, corrupted, eps=1e-5, **stream_args) -> Tensor:
    """Central differences of M in every edge weight, at weights 0."""
    E = len(Seq2SeqGraph.of(model).edges)
    index = torch.arange(E)
    weights = torch.zeros(2 * E, E, dtype=torch.float64)
    weights[2 * index, index], weights[2 * index + 1, index] = eps, -eps
    values = weights_at(weights)
    return (values[0::2] - values[1::2]) / (2 * eps)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("zero", [False, True])
def test_eap_equals_finite_differences_of_the_edge_metric(name, zero):
    model = make(name)
    corrupted = seq2seq_outputs(model, SRC2, TGT2)
    corrupted = corrupted.zeros() if zero else corrupted
    eap = seq2seq_eap_scores(model, SRC, TGT, corrupted, METRIC, POINTS)

    def metric_at(weights):
        return seq2seq_edge_metric(model, SRC, TGT, corrupted, weights, METRIC, POINTS, rows_per_pass=128)

    fd = finite_differences(model, metric_at, corrupted)
    torch.testing.assert_close(eap, fd, rtol=0, atol=1e-6)
    assert eap.abs().max() > 1e-2  # far above the tolerance
    torch.testing.assert_close(seq2seq_eap_ig_scores(model, SRC, TGT, corrupted, METRIC, POINTS, steps=1), eap)


def test_eap_ig_is_the_mean_of_finite_differences_at_its_interpolated_embeddings():
    model = make("post_ln")
    steps = 3
    clean, corrupted = seq2seq_outputs(model, SRC, TGT), seq2seq_outputs(model, SRC2, TGT2)
    ig = seq2seq_eap_ig_scores(model, SRC, TGT, (SRC2, TGT2), METRIC, POINTS, steps=steps)
    total = 0
    for k in range(1, steps + 1):
        enc = corrupted.enc.emb + k / steps * (clean.enc.emb - corrupted.enc.emb)
        dec = corrupted.dec.emb + k / steps * (clean.dec.emb - corrupted.dec.emb)

        def metric_at(weights, enc=enc, dec=dec):
            with torch.no_grad():
                stream, _ = seq2seq_stream(model, enc, dec, weights, corrupted, clean)
                logits = model.decoder.unembed(stream.view(len(weights), B, T, -1)[:, POINTS])
            return torch.stack([METRIC(row).double().sum() for row in logits])

        total = total + finite_differences(model, metric_at, corrupted)
    torch.testing.assert_close(ig, total / steps, rtol=0, atol=1e-6)
    assert (ig - seq2seq_eap_scores(model, SRC, TGT, (SRC2, TGT2), METRIC, POINTS)).abs().max() > 1e-3


@pytest.mark.parametrize("kind", ["enc", "dec", "cross"])
def test_removing_a_heads_out_edges_is_replacing_its_z_by_its_corrupted_z(kind):
    """The circuit of every edge not out of one head, evaluated by the edge forward, equals the model with that head's
    z replaced by the corrupted run's (its gate 0, the corrupted z as replacement: the model's own ablation path)."""
    model = make()
    graph = Seq2SeqGraph.of(model)
    head = f"{kind}.L1H1"
    kept = [i for i, e in enumerate(graph.edges) if e.sender.name != head]
    # by hand: enc.L1H1 into enc.L1.mlp and every cross head's k and v; dec.L1H1 into cross.L1H*.q, dec.L1.mlp, logits
    assert len(graph.edges) - len(kept) == {"enc": 1 + 2 * 3 * 2, "dec": 3 + 1 + 1, "cross": 1 + 1}[kind]
    (faith,) = seq2seq_faithfulness(model, SRC, TGT, (SRC2, TGT2), [kept], METRIC, POINTS)
    cache = {}
    with torch.no_grad():
        model(SRC2, TGT2, cache=cache)
        site = f"{'enc' if kind == 'enc' else 'dec'}.blocks.1.{'cross' if kind == 'cross' else 'attn'}.z"
        gates = {kind: torch.ones(model.head_kinds[kind], dtype=torch.float64)}
        gates[kind][1, 1] = 0
        replaced = model(SRC, TGT, gates=gates, replacements={kind: [None, cache[site]]})
        ends = [model(SRC, TGT), model(SRC2, TGT2)]
    clean, removed, by_gates = [float(logprob(x[POINTS], NEXT[POINTS]).double().sum()) for x in (*ends, replaced)]
    torch.testing.assert_close(faith.item(), (by_gates - removed) / (clean - removed), rtol=0, atol=1e-10)
    assert abs(faith.item() - 1) > 1e-4
    every, none = seq2seq_faithfulness(
        model, SRC, TGT, (SRC2, TGT2), [list(range(len(graph.edges))), []], METRIC, POINTS
    )
    assert (every.item(), none.item()) == (1.0, 0.0)


def hooked_path_patch(model: EncoderDecoder, senders: list[str], receivers: list[str]) -> float:
    """M(patched) - M(clean) by hooks at the model's sites (pre-LN): each receiver's input set to its clean value plus
    the senders' corrupted-minus-clean terms on the edges into it (a cross head's z recomputed at cross.z from its
    clean query stream or its clean copy of the encoder's output so moved), everything else running on."""
    graph = Seq2SeqGraph.of(model)
    clean, corrupted = reads(model, SRC, TGT), reads(model, SRC2, TGT2)
    sites = {}  # the clean run's receiver inputs at their sites
    hooks = []
    for stack, n_layers in (("enc", model.cfg.encoder_layers), ("dec", model.cfg.n_layers)):
        for layer in range(n_layers):
            for site in ("attn.q_input", "attn.k_input", "attn.v_input", "mlp.input", "resid_pre", "attn_out"):
                name = f"{stack}.blocks.{layer}.{site}"
                hooks.append((name, lambda x, s, name=name: sites.__setitem__(name, x)))
    hooks.append((f"dec.blocks.{model.cfg.n_layers - 1}.resid_post", lambda x, s: sites.__setitem__("final", x)))
    with torch.no_grad():
        model(SRC, TGT, intervention=StackIntervention(hooks))

    def delta(receiver: str) -> Tensor:
        read = [s for s in senders if f"{s} -> {receiver}" in graph.edge_index]
        return sum(term(model, s, corrupted) - term(model, s, clean) for s in read)

    edits: dict[str, list] = {}
    for receiver in receivers:
        if receiver == "logits":
            edits.setdefault(f"dec.blocks.{model.cfg.n_layers - 1}.resid_post", []).append((None, receiver))
            continue
        stack, rest = receiver.split(".", 1)
        layer = int(rest[1])
        if rest.endswith(".mlp"):
            edits.setdefault(f"dec.blocks.{layer}.mlp.input", []).append((None, receiver))
        elif stack == "dec":
            edits.setdefault(f"dec.blocks.{layer}.attn.{rest[-1]}_input", []).append((int(rest[3]), receiver))
        else:
            edits.setdefault(f"dec.blocks.{layer}.cross.z", []).append((int(rest[3]), receiver))
    memory = model.memory_of(clean["enc.final"])
    run = {}
    hooks = []
    for layer in range(model.cfg.n_layers):
        for site in ("resid_pre", "attn_out"):
            name = f"dec.blocks.{layer}.{site}"
            hooks.append((name, lambda x, s, name=name: run.__setitem__(name, x)))
    for site, changes in edits.items():
        if site.endswith("cross.z"):
            layer = int(site.split(".")[2])

            def cross_z(z, s, layer=layer, changes=changes):
                block, z = model.decoder.blocks[layer], z.clone()
                cross = block.cross
                for head in sorted({h for h, _ in changes}):
                    mine = {r.rsplit(".", 1)[1]: r for h, r in changes if h == head}
                    mid = f"dec.blocks.{layer}."
                    if "q" in mine:
                        query = sites[mid + "resid_pre"] + sites[mid + "attn_out"] + delta(mine["q"])
                    else:
                        query = run[mid + "resid_pre"] + run[mid + "attn_out"]
                    keys, values = (
                        model.memory_of(clean["enc.final"] + delta(mine[w])) if w in mine else memory for w in "kv"
                    )
                    g = cross.kv_head_of[head]
                    q = block.ln_cross(query) @ cross.W_Q[head] + (0 if cross.b_Q is None else cross.b_Q[head])
                    k = keys @ cross.W_K[g] + (0 if cross.b_K is None else cross.b_K[g])
                    v = values @ cross.W_V[g] + (0 if cross.b_V is None else cross.b_V[g])
                    z[:, :, head] = ((q @ k.transpose(1, 2)) * cross.head_dim**-0.5).softmax(-1) @ v
                return z

            hooks.append((site, cross_z))
        else:

            def held(x, s, site=site, changes=changes):
                x = x.clone()
                for head, receiver in changes:
                    value = sites["final" if receiver == "logits" else site]
                    if head is None:
                        x = value + delta(receiver)
                    else:
                        x[:, :, head] = value[:, :, head] + delta(receiver)
                return x

            hooks.append((site, held))
    with torch.no_grad():
        patched = model(SRC, TGT, intervention=StackIntervention(hooks))
        plain = model(SRC, TGT)
    return float((logprob(patched[POINTS], NEXT[POINTS]) - logprob(plain[POINTS], NEXT[POINTS])).double().sum())


PATHS = [
    (["dec.L0H0"], ["cross.L0H1.q", "dec.L1H0.k", "logits"]),  # receivers in a chain: each held at its clean input
    (["enc.L0H1", "enc.emb"], ["cross.L0H0.k", "cross.L1H2.v"]),
    (["cross.L0H0", "dec.L0.mlp", "dec.emb"], ["dec.L1H1.v", "dec.L1.mlp", "cross.L1H1.q"]),
    (["enc.L1.mlp", "dec.L0H1"], ["cross.L1H0.q", "cross.L1H0.k", "cross.L0H2.v", "dec.L1H0.q"]),
]


@pytest.mark.parametrize("name", ["pre_ln", "grouped_cross_sum"])
def test_path_patching_equals_hooks_holding_each_receiver_at_its_clean_input(name):
    model = make(name)
    effects = seq2seq_path_patch(model, SRC, TGT, (SRC2, TGT2), PATHS, METRIC, POINTS, rows_per_pass=3)
    by_hooks = torch.tensor([hooked_path_patch(model, *pair) for pair in PATHS], dtype=torch.float64)
    torch.testing.assert_close(effects, by_hooks, rtol=0, atol=1e-10)
    assert (effects.abs() > 1e-6).all()
    # the chain's receivers held at their clean inputs differ from the edges removed in one run
    graph = Seq2SeqGraph.of(model)
    weights = torch.zeros(2, len(graph.edges), dtype=torch.float64)
    weights[1, graph.edges_named(["dec.L0H0 -> cross.L0H1.q", "dec.L0H0 -> dec.L1H0.k", "dec.L0H0 -> logits"])] = 1
    edges = seq2seq_edge_metric(model, SRC, TGT, (SRC2, TGT2), weights, METRIC, POINTS)
    assert abs((edges[1] - edges[0]) - effects[0]) > 1e-6
    # one edge: its exact score
    (one,) = seq2seq_path_patch(model, SRC, TGT, (SRC2, TGT2), [(["enc.L0H1"], ["cross.L1H0.k"])], METRIC, POINTS)
    (exact,) = seq2seq_exact_edge_scores(
        model, SRC, TGT, (SRC2, TGT2), METRIC, POINTS, edges=graph.edges_named(["enc.L0H1 -> cross.L1H0.k"])
    )
    torch.testing.assert_close(one, exact, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["post_ln", "grouped_cross_sum"])
def test_path_patching_into_one_receiver_is_the_edges_removed_and_one_edge_its_exact_score(name):
    """With one receiver nothing before it changes, so holding it at the clean run changes nothing: path patching of
    senders into it equals the edge-patched forward with those edges removed (post-LN: through the blocks' norms)."""
    model = make(name)
    graph = Seq2SeqGraph.of(model)
    pairs = [(["enc.emb", "enc.L0H1", "enc.L1.mlp"], ["cross.L1H0.v"]), (["dec.L0H1", "cross.L0H2"], ["logits"])]
    effects = seq2seq_path_patch(model, SRC, TGT, (SRC2, TGT2), pairs, METRIC, POINTS)
    weights = torch.zeros(3, len(graph.edges), dtype=torch.float64)
    for row, (senders, (receiver,)) in enumerate(pairs, start=1):
        weights[row, graph.edges_named([f"{s} -> {receiver}" for s in senders])] = 1
    edges = seq2seq_edge_metric(model, SRC, TGT, (SRC2, TGT2), weights, METRIC, POINTS)
    torch.testing.assert_close(effects, edges[1:] - edges[0], rtol=0, atol=1e-12)
    assert (effects.abs() > 1e-6).all()
    chosen = graph.edges_named(["enc.L0H0 -> cross.L0H1.k", "cross.L0H1 -> dec.L1H0.q", "dec.emb -> dec.L1.mlp"])
    singles = [([graph.edges[i].sender.name], [graph.edges[i].receiver.name]) for i in chosen]
    torch.testing.assert_close(
        seq2seq_path_patch(model, SRC, TGT, (SRC2, TGT2), singles, METRIC, POINTS),
        seq2seq_exact_edge_scores(model, SRC, TGT, (SRC2, TGT2), METRIC, POINTS, edges=chosen),
        rtol=0,
        atol=1e-12,
    )


@pytest.mark.parametrize(
    "pair, message",
    [
        ((["enc.L0H0"], ["enc.L1H0.q"]), "circuits.receivers='enc.L1H0.q': path patching into an encoder's own"),
        ((["enc.L1.mlp"], ["dec.L1H0.q"]), "circuits.receivers='dec.L1H0.q': reads none of the senders enc.L1.mlp"),
        ((["dec.L3H0"], ["logits"]), "circuits.senders='dec.L3H0': no such sender in this model"),
        ((["dec.L0H0"], ["cross.L0H0.z"]), "circuits.receivers='cross.L0H0.z': no such receiver input"),
    ],
)
def test_path_patching_bad_names_are_one_line(pair, message):
    with pytest.raises(ConfigError) as error:
        seq2seq_path_patch(make(), SRC, TGT, (SRC2, TGT2), [pair], METRIC, POINTS)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_what_is_not_defined_through_cross_attention_is_refused_by_name():
    model = make()
    with pytest.raises(ConfigError) as error:
        Graph.of(model)
    assert "not defined through cross-attention" in str(error.value) and "seq2seq_" in str(error.value)
    with pytest.raises(ConfigError, match="path patching"):
        path_patch(model, SRC, SRC2, [(["enc.L0H0"], ["cross.L0H0.k"])], METRIC)
    relative = EncoderDecoder(config(positions="relative", relative_buckets=8, relative_max_distance=6)).eval()
    with pytest.raises(ConfigError, match="model.positions") as error:
        seq2seq_eap_scores(relative, SRC, TGT, (SRC2, TGT2), METRIC, POINTS)
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="steps"):
        seq2seq_eap_ig_scores(model, SRC, TGT, (SRC2, TGT2), METRIC, POINTS, steps=0)


def test_one_example_per_pass_equals_one_pass():
    """Passes of examples (each with its points' own answers, POINTS holding 4, 5 and 3 points) add up to one pass:
    exact scores, path patching, faithfulness, EAP and EAP-IG (float64)."""
    model = make("post_ln")
    graph = Seq2SeqGraph.of(model)
    corrupted = (SRC2, TGT2)
    edges = graph.edges_named(["enc.L0H1 -> cross.L1H0.k", "cross.L0H2 -> dec.L1H0.v", "dec.L1H1 -> logits"])
    pairs = [(["dec.L0H0", "enc.emb"], ["cross.L0H1.q", "cross.L1H2.v", "logits"])]
    for per in (1, 2):
        split = {"examples_per_pass": per}
        torch.testing.assert_close(
            seq2seq_exact_edge_scores(model, SRC, TGT, corrupted, METRIC, POINTS, edges=edges, **split),
            seq2seq_exact_edge_scores(model, SRC, TGT, corrupted, METRIC, POINTS, edges=edges),
            rtol=0,
            atol=1e-12,
        )
        torch.testing.assert_close(
            seq2seq_path_patch(model, SRC, TGT, corrupted, pairs, METRIC, POINTS, **split),
            seq2seq_path_patch(model, SRC, TGT, corrupted, pairs, METRIC, POINTS),
            rtol=0,
            atol=1e-12,
        )
        torch.testing.assert_close(
            seq2seq_faithfulness(model, SRC, TGT, corrupted, [edges], METRIC, POINTS, **split),
            seq2seq_faithfulness(model, SRC, TGT, corrupted, [edges], METRIC, POINTS),
            rtol=0,
            atol=1e-12,
        )
        for steps in (None, 3):
            torch.testing.assert_close(
                seq2seq_eap_ig_scores(model, SRC, TGT, corrupted, METRIC, POINTS, steps, **split),
                seq2seq_eap_ig_scores(model, SRC, TGT, corrupted, METRIC, POINTS, steps),
                rtol=0,
                atol=1e-12,
            )
    with pytest.raises(ConfigError, match="examples_per_pass"):
        seq2seq_eap_scores(model, SRC, TGT, corrupted, METRIC, POINTS, examples_per_pass=0)

"""Edges and circuits on encoders (model.causal=false): the edge-patched forward at its ends, exact edge patching and
path patching against raw torch hooks on transformers' BertForMaskedLM (eager attention), EAP and EAP-IG against
finite differences, on tiny random encoders in float32 and float64, post-LN (BERT) and pre-LN alike; and
cross-attention refused by name."""

import pytest
import torch
from encoder_helpers import converted, hf_model

from headcount.circuits import (
    Graph,
    eap_ig_scores,
    eap_scores,
    edge_forward,
    edge_metric,
    exact_edge_scores,
    faithfulness,
    node_outputs,
    path_patch,
)
from headcount.circuits.autograd_edges import autograd_edge_scores
from headcount.config.model import AttentionConfig, ModelConfig
from headcount.errors import ConfigError
from headcount.model.encoder_decoder import EncoderDecoder
from headcount.model.transformer import Transformer

TOL = {torch.float64: 1e-9, torch.float32: 2e-4}
# scored before the corrupted position (5) in prompts 0 and 2: a causal mask would hide the corruption there
SCORED = torch.tensor([2, 6, 1])
A, W = 7, 11  # logit(A) - logit(W) at the scored position, a masked-LM point's metric


def metric(logits_PV: torch.Tensor) -> torch.Tensor:
    return logits_PV[:, A] - logits_PV[:, W]


def tiny_encoder(dtype: torch.dtype, post_ln: bool) -> Transformer:
    """A tiny random encoder with MLPs and a masked-LM head: BERT's post-LN blocks, or pre-LN ones."""
    torch.manual_seed(3)
    norms = {"post_ln": True, "pre_norm": False, "final_norm": False} if post_ln else {}
    cfg = ModelConfig(
        vocab_size=40, d_model=24, n_layers=3, n_ctx=16, causal=False, mlp=True, embed_norm=True, mlm_head=True,
        **norms,
    )  # fmt: skip
    cfg.attn.n_heads = 3
    model = Transformer(cfg).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def tiny_random_bert(dtype: torch.dtype) -> Transformer:
    from headcount.pretrained import load_pretrained

    return load_pretrained("headcount:tiny-random-bert", dtype).model.eval()


MODELS = {
    "post_ln": lambda dtype: tiny_encoder(dtype, True),
    "pre_ln": lambda dtype: tiny_encoder(dtype, False),
    "bert_mlm": lambda dtype: converted("bert_mlm_tanh_gelu", dtype)[1].eval(),
    "tiny_random_bert": tiny_random_bert,
}


def pair(model: Transformer, T: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Clean ids and corrupted ones that differ at position 5 alone (no pad or special ids)."""
    g = torch.Generator().manual_seed(5)
    clean = torch.randint(5, min(model.cfg.vocab_size, 60), (3, T), generator=g)
    corrupted = clean.clone()
    corrupted[:, 5] = 5 + (clean[:, 5] - 5 + 3) % (min(model.cfg.vocab_size, 60) - 5)
    return clean, corrupted


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", list(MODELS))
def test_edge_forward_at_weights_0_is_the_encoder_and_at_1_its_corrupted_run(name, dtype):
    model = MODELS[name](dtype)
    clean, corrupted = pair(model)
    E = len(Graph.of(model).edges)
    outputs = node_outputs(model, corrupted)
    for value, ids in ((0.0, clean), (1.0, corrupted)):
        weights = torch.full((1, E), value, dtype=dtype)
        logits, _ = edge_forward(model, model.embed(clean), weights, outputs)
        torch.testing.assert_close(logits, model(ids), atol=TOL[dtype] * 10, rtol=TOL[dtype] * 10)
    plain, _ = edge_forward(model, model.embed(clean))
    torch.testing.assert_close(plain, model(clean), atol=TOL[dtype], rtol=TOL[dtype])


# --- an independent implementation: raw torch hooks on transformers' BertForMaskedLM ------------------------------


def hooked_run(hf, ids, hooks: dict) -> torch.Tensor:
    """hf's logits with forward (or, for names ending in ':pre', forward-pre) hooks on its named modules."""
    handles = []
    modules = dict(hf.named_modules())
    for name, hook in hooks.items():
        if name.endswith(":pre"):
            handles.append(modules[name[:-4]].register_forward_pre_hook(hook))
        else:
            handles.append(modules[name].register_forward_hook(hook))
    try:
        return hf(input_ids=ids).logits
    finally:
        for handle in handles:
            handle.remove()


def cached(hf, ids) -> dict:
    """Every layer's heads' context (input of attention.output.dense), attention output (its output) and MLP output
    (output.dense's output), and the final stream."""
    cache: dict = {}
    hooks = {}
    for i in range(hf.config.num_hidden_layers):
        prefix = f"bert.encoder.layer.{i}"
        hooks[f"{prefix}.attention.output.dense:pre"] = lambda m, a, i=i: cache.__setitem__(("z", i), a[0].clone())
        hooks[f"{prefix}.attention.output.dense"] = lambda m, a, o, i=i: cache.__setitem__(("attn", i), o.clone())
        hooks[f"{prefix}.output.dense"] = lambda m, a, o, i=i: cache.__setitem__(("mlp", i), o.clone())
    hooked_run(hf, ids, hooks)
    return cache


def frozen_stream(hf, clean_ids, clean: dict, corrupted: dict, senders: list[tuple[int, int]], into: int | None):
    """The stream into layer `into` (None: after the last layer) with the sender heads' contexts corrupted and every
    other node's output clean: the heads' own layers recompute their attention output from the patched contexts,
    every later attention output and every MLP output is forced to its clean value."""
    D = hf.config.hidden_size // hf.config.num_attention_heads
    first = min(layer for layer, _ in senders)
    hooks, seen = {}, {}

    def patch_z(module, args, layer):
        z = args[0].clone()
        for sender_layer, head in senders:
            if sender_layer == layer:
                z[..., head * D : (head + 1) * D] = corrupted["z", layer][..., head * D : (head + 1) * D]
        return (z,)

    for i in range(hf.config.num_hidden_layers):
        prefix = f"bert.encoder.layer.{i}"
        if i in {layer for layer, _ in senders}:
            hooks[f"{prefix}.attention.output.dense:pre"] = lambda m, a, i=i: patch_z(m, a, i)
        elif i > first:
            hooks[f"{prefix}.attention.output.dense"] = lambda m, a, o, i=i: clean["attn", i]
        if i >= first:
            hooks[f"{prefix}.output.dense"] = lambda m, a, o, i=i: clean["mlp", i]
    if into is not None:
        hooks[f"bert.encoder.layer.{into}:pre"] = lambda m, a: seen.__setitem__("x", a[0].clone())
    else:
        hooks["cls:pre"] = lambda m, a: seen.__setitem__("x", a[0].clone())
    hooked_run(hf, clean_ids, hooks)
    return seen["x"]


def hooks_path_patch(hf, clean_ids, corrupted_ids, senders: list[tuple[int, int]], receiver: str) -> torch.Tensor:
    """Logits of the clean run with the receiver's input ("L1H2.q", or "logits") built from the frozen stream."""
    clean, corrupted = cached(hf, clean_ids), cached(hf, corrupted_ids)
    if receiver == "logits":
        x = frozen_stream(hf, clean_ids, clean, corrupted, senders, None)
        return hf.cls(x)
    layer, head, which = int(receiver[1]), int(receiver[3]), receiver[-1]
    x = frozen_stream(hf, clean_ids, clean, corrupted, senders, layer)
    D = hf.config.hidden_size // hf.config.num_attention_heads
    projection = {"q": "query", "k": "key", "v": "value"}[which]
    module = f"bert.encoder.layer.{layer}.attention.self.{projection}"

    def replace(m, args, out):
        out = out.clone()
        projected = torch.nn.functional.linear(x, m.weight, m.bias)  # m(x) would run this hook again
        out[..., head * D : (head + 1) * D] = projected[..., head * D : (head + 1) * D]
        return out

    return hooked_run(hf, clean_ids, {module: replace})


def summed(logits_BTV: torch.Tensor) -> float:
    at = logits_BTV[torch.arange(len(SCORED)), SCORED]
    return float(metric(at).double().sum())


HOOKS_TOL = {torch.float64: 1e-11, torch.float32: 2e-6}  # effects of 1e-6 .. 1e-2 here: each comparison can fail
PATCH_TOL = {torch.float64: 1e-10, torch.float32: 1e-5}
EDGES = ["L0H1 -> L1H2.q", "L0H3 -> L1H0.k", "L0H2 -> L1H1.v", "L0H0 -> logits", "L1H3 -> logits"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_exact_edge_scores_and_path_patching_equal_raw_hooks_on_transformers_bert(dtype):
    hf, model = converted("bert_mlm_tanh_gelu", dtype)
    model.eval()
    clean, corrupted = pair(model)
    graph = Graph.of(model)
    with torch.no_grad():
        base = summed(hf(input_ids=clean).logits)
        exact = exact_edge_scores(model, clean, corrupted, metric, SCORED, edges=[graph.edge_index[e] for e in EDGES])
        for edge, score in zip(EDGES, exact.tolist()):
            sender, receiver = edge.split(" -> ")
            by_hooks = summed(hooks_path_patch(hf, clean, corrupted, [(int(sender[1]), int(sender[3]))], receiver))
            assert score == pytest.approx(by_hooks - base, abs=HOOKS_TOL[dtype]), edge
            assert abs(score) > 100 * HOOKS_TOL[torch.float64], edge  # the edge does something: a miss shows
        pairs = [(["L0H1", "L0H3"], ["L1H2.q"]), (["L0H0"], ["L1H3.k"]), (["L0H2", "L0H0"], ["L1H1.v"])]
        effects = path_patch(model, clean, corrupted, pairs, metric, SCORED)
        for (senders, (receiver,)), effect in zip(pairs, effects.tolist()):
            heads = [(int(s[1]), int(s[3])) for s in senders]
            by_hooks = summed(hooks_path_patch(hf, clean, corrupted, heads, receiver))
            assert effect == pytest.approx(by_hooks - base, abs=HOOKS_TOL[dtype]), (senders, receiver)
            assert abs(effect) > 100 * HOOKS_TOL[torch.float64], (senders, receiver)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", ["post_ln", "pre_ln", "tiny_random_bert"])
def test_single_edge_path_patching_equals_exact_edge_patching(name, dtype):
    model = MODELS[name](dtype)
    clean, corrupted = pair(model)
    graph = Graph.of(model)
    chosen = list(range(0, len(graph.edges), max(1, len(graph.edges) // 12)))
    exact = exact_edge_scores(model, clean, corrupted, metric, SCORED, edges=chosen)
    pairs = [([graph.edges[i].sender.name], [graph.edges[i].receiver.name]) for i in chosen]
    effects = path_patch(model, clean, corrupted, pairs, metric, SCORED)
    torch.testing.assert_close(effects, exact, atol=PATCH_TOL[dtype], rtol=0)
    assert exact.abs().max() > 4 * PATCH_TOL[torch.float32]


def finite_differences(model, clean, corrupted, edges: list[int], h: float) -> torch.Tensor:
    E = len(Graph.of(model).edges)
    weights = torch.zeros(2 * len(edges), E, dtype=torch.float64)
    for k, i in enumerate(edges):
        weights[2 * k, i], weights[2 * k + 1, i] = h, -h
    values = edge_metric(model, clean, corrupted, weights, metric, SCORED)
    return (values[0::2] - values[1::2]) / (2 * h)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", ["post_ln", "pre_ln", "bert_mlm"])
def test_eap_equals_finite_differences_of_the_edge_forward(name, dtype):
    model = MODELS[name](dtype)
    clean, corrupted = pair(model)
    graph = Graph.of(model)
    eap = eap_scores(model, clean, corrupted, metric, SCORED)
    chosen = list(range(0, len(graph.edges), max(1, len(graph.edges) // 15)))
    h = 1e-5 if dtype == torch.float64 else 3e-3
    fd = finite_differences(model, clean, corrupted, chosen, h)
    torch.testing.assert_close(eap[chosen], fd, atol=1e-6 if dtype == torch.float64 else 5e-3, rtol=1e-3)
    assert fd.abs().max() > 1e-3
    # every edge: the one-backward products (pre-LN) or the autograd gradient (post-LN) equal autograd's
    by_autograd = autograd_edge_scores(model, clean, corrupted, metric, None, SCORED)
    torch.testing.assert_close(eap, by_autograd, atol=TOL[dtype] * 10, rtol=TOL[dtype] * 10)
    per_example = eap_scores(model, clean, corrupted, metric, SCORED, per_example=True)
    torch.testing.assert_close(per_example.sum(0), eap, atol=TOL[dtype] * 10, rtol=TOL[dtype] * 10)


@pytest.mark.parametrize("name", ["post_ln", "pre_ln"])
def test_eap_ig_is_the_mean_gradient_at_its_interpolated_embeddings(name):
    """EAP-IG at steps m: (1/m) sum_k dM/da at a = 0 on the run from emb' + (k/m)(emb - emb'), reference the clean
    run, each gradient by finite differences of the edge forward."""
    dtype, steps, h = torch.float64, 3, 1e-5
    model = MODELS[name](dtype)
    clean, corrupted = pair(model)
    graph = Graph.of(model)
    chosen = list(range(0, len(graph.edges), max(1, len(graph.edges) // 10)))
    ig = eap_ig_scores(model, clean, corrupted, metric, steps, SCORED)
    clean_out, corrupted_out = node_outputs(model, clean), node_outputs(model, corrupted)
    expected = torch.zeros(len(chosen), dtype=torch.float64)
    for k in range(1, steps + 1):
        emb = corrupted_out.emb + (k / steps) * (clean_out.emb - corrupted_out.emb)
        for j, i in enumerate(chosen):
            values = []
            for a in (h, -h):
                weights = torch.zeros(1, len(graph.edges), dtype=dtype)
                weights[0, i] = a
                logits, _ = edge_forward(model, emb, weights, corrupted_out, clean_out)
                values.append(float(metric(logits[torch.arange(3), SCORED]).sum().detach()))
            expected[j] += (values[0] - values[1]) / (2 * h) / steps
    torch.testing.assert_close(ig[chosen], expected, atol=1e-6, rtol=1e-4)
    assert expected.abs().max() > 1e-3


@pytest.mark.parametrize("name", ["post_ln", "pre_ln"])
def test_path_patching_on_an_encoder_reaches_score_points_before_the_corruption(name):
    """Prompts 0 and 2 are scored before the position that differs: under causal attention nothing could reach
    them (the suffix run would skip them); on an encoder the effect is there and equals exact edge patching."""
    model = MODELS[name](torch.float64)
    clean, corrupted = pair(model, T=12)
    early = torch.tensor([1, 2, 3])
    graph = Graph.of(model)
    edge = graph.edge_index["L0H1 -> L1H0.v"]
    exact = exact_edge_scores(model, clean, corrupted, metric, early, edges=[edge])
    effect = path_patch(model, clean, corrupted, [(["L0H1"], ["L1H0.v"])], metric, early)
    assert abs(float(exact[0])) > 1e-4
    torch.testing.assert_close(effect, exact, atol=1e-11, rtol=0)


def test_faithfulness_of_every_edge_is_1_and_of_none_is_0_on_an_encoder():
    model = MODELS["post_ln"](torch.float64)
    clean, corrupted = pair(model)
    E = len(Graph.of(model).edges)
    full, empty = faithfulness(model, clean, corrupted, [set(range(E)), set()], metric, SCORED).tolist()
    assert full == pytest.approx(1.0, abs=1e-9) and empty == pytest.approx(0.0, abs=1e-9)


def test_cross_attention_is_refused_by_name_in_one_line():
    cfg = ModelConfig(
        vocab_size=30, d_model=16, n_layers=2, n_ctx=12, encoder_layers=2, cross_attn=AttentionConfig(n_heads=2)
    )
    model = EncoderDecoder(cfg)
    for stack, key in ((model, "model.encoder_layers=2: "), (model.decoder, "model.cross_attn='set': ")):
        with pytest.raises(ConfigError) as error:
            Graph.of(stack)
        message = str(error.value)
        assert "\n" not in message and "not defined through cross-attention" in message
        assert message.startswith(key)


def test_transformers_bert_helper_is_an_eager_masked_lm():
    """The hooks above read BertForMaskedLM's modules by name: the helper gives one, eager attention."""
    hf = hf_model("bert_mlm_tanh_gelu")
    assert type(hf).__name__ == "BertForMaskedLM" and hf.config._attn_implementation == "eager"


def test_masked_agreement_prompts_are_one_length_and_scored_at_the_mask():
    from headcount.config.task import TaskConfig
    from headcount.pretrained import load_pretrained
    from headcount.tasks import HFTokens
    from headcount.tasks.masked_agreement import MaskedAgreement

    tokenizer = load_pretrained("headcount:tiny-random-bert").tokenizer
    prompts = MaskedAgreement().prompts(TaskConfig(source="masked_agreement", n_prompts=6), HFTokens(tokenizer))
    assert {len(p.prompt) for p in prompts} == {len(p.corrupted) for p in prompts} == {len(prompts[0].prompt)}
    for i, p in enumerate(prompts):
        assert p.prompt[p.positions[0]] == tokenizer.mask_token_id == p.corrupted[p.positions[0]]
        assert (p.answers, p.wrongs) == ((["is"], ["are"]) if i % 2 == 0 else (["are"], ["is"]))
        assert p.prompt != p.corrupted and p.prompt[0] == tokenizer.cls_token_id


@pytest.mark.slow
def test_encoder_circuit_scans_from_the_command_line_agree_with_python(tmp_path):
    """headcount-ablate's path_patching and edge_attribution on headcount:tiny-random-bert's masked_agreement, and
    Run.evaluate(edges_removed=...) from Python: one edge's effect three ways (float64)."""
    import subprocess
    import sys
    from pathlib import Path

    import pandas as pd

    import headcount

    script = Path(__file__).resolve().parents[1] / "scripts" / "ablate.py"
    args = ["model=minilm_l6", "model.pretrained=headcount:tiny-random-bert", "task=masked_agreement"]
    args += ["task.n_prompts=6", "ablation.mode=patch", "ablation.progress=false"]
    args += ["ablation=[path_patching,edge_attribution]", "ablation.scans.path_patching.senders=[L0H1]"]
    args += ["ablation.scans.path_patching.receivers=[L1H3.v]", "ablation.scans.edge_attribution.exact_all=true"]
    args += ["ablation.scans.edge_attribution.steps=2", "ablation.scans.edge_attribution.random_sets=1"]
    subprocess.run([sys.executable, str(script), *args, f"run_dir={tmp_path}"], cwd=tmp_path, check=True)
    folder = tmp_path / "ablation" / "tasks" / "masked_agreement"
    path = pd.read_csv(next(folder.glob("path_patching.*.csv")))
    edges = pd.read_csv(next(folder.glob("edge_attribution.*.csv")))
    run = headcount.load_run(tmp_path)
    task = {"source": "masked_agreement", "n_prompts": 6}
    table = run.evaluate(edges_removed=["L0H1 -> L1H3.v"], mode="patch", task=task)
    effect = float(path["effect"].iloc[0])
    exact = float(edges.loc[edges["edge"] == "L0H1 -> L1H3.v", "exact"].iloc[0])
    # scans run in float32 and a random BERT's effects are about 1e-7 here: the three agree to float32's noise (the
    # computations are checked exactly in float64 above); a wrong wiring would differ by far more
    assert abs(effect) > 1e-8
    assert float(table["delta_logit_diff"].iloc[0]) == pytest.approx(effect, rel=0.05)
    assert exact == pytest.approx(effect, rel=0.05)
    # a head patched at [SEP], after the mask: on an encoder it can change the score, so it is not refused
    at_end = run.evaluate({"at end": "L0H1@end"}, mode="patch", task=task, patch_positions="each")
    assert len(at_end) == 1 and bool(at_end["delta_logit_diff"].notna().all())
    ranking = edges.sort_values("eap", key=abs, ascending=False)["edge"].tolist()
    scores = run.circuit_performance({"eap": ranking}, mode="patch", task=task, resamples=0)
    assert list(scores["method"]) == ["eap"] and scores["f_100%"].iloc[0] == pytest.approx(1.0, abs=1e-3)


def test_an_encoder_s_prompts_of_different_lengths_are_refused_for_edges_in_one_line():
    from headcount.ablation.engine.modes import MODES
    from headcount.ablation.scans.circuit_inputs import edge_inputs
    from headcount.data.examples import ExampleBatches

    model = tiny_encoder(torch.float32, True)
    ids = torch.randint(5, 40, (2, 6))
    valid = torch.ones(2, 6, dtype=torch.bool)
    valid[1, 4:] = False  # the second prompt is right-padded
    batch = {"input_ids": ids, "source_ids": ids, "valid": valid, "score_mask": valid.clone(), "answer_ids": ids}
    with pytest.raises(ConfigError) as error:
        edge_inputs(ExampleBatches(batch, 2), MODES["patch"](), model, None, "ablation.scans.path_patching")
    message = str(error.value)
    assert message.startswith("ablation.scans.path_patching='prompts of different lengths': an encoder")
    assert "\n" not in message

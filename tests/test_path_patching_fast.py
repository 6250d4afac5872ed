"""Path patching's fast receiver inputs (circuits/path_patching.py): the clean stream into each receiver plus one
change per pair equals the general formula (forward.py's receiver_inputs with the senders' edges at weight 1, every
earlier sender re-added) in float64, on pre-norm and post-norm families, and the comparison catches planted errors;
the running-sum streams and the plain forward give the general formula's bits."""

import pytest
import torch
from test_circuits import PAIRS, make_model, prompts

import headcount.circuits.path_patching as pp
from headcount.circuits.forward import edge_forward, node_outputs, plain_streams, receiver_inputs
from headcount.circuits.graph import Graph

FAMILIES = ["llama3", "gpt2", "neox_parallel", "gemma3", "olmo2"]  # pre-norm, parallel residual, post-norms


def fast_and_general(family: str) -> tuple[dict, dict, dict]:
    """{(pair, receiver): input} from patched_inputs, from receiver_inputs, and the clean input (nothing patched),
    for the family's test pairs."""
    model = make_model(family, torch.float64)
    graph = Graph.of(model)
    clean_ids, corrupted_ids = prompts(T=16)
    clean, corrupted = node_outputs(model, clean_ids), node_outputs(model, corrupted_ids)
    pairs = [pp._resolve(graph, senders, receivers) for senders, receivers in PAIRS[family]]
    with torch.no_grad():
        fast = pp.patched_inputs(model, graph, clean, corrupted, pairs)
        general, plain = {}, {}
        for p, (senders, receivers) in enumerate(pairs):
            for r in receivers:
                n = graph.n_senders(r)
                w_S = torch.zeros(n, dtype=torch.float64)
                w_S[[graph.senders.index(s) for s in senders]] = 1.0
                delta = corrupted.minus(clean)
                general[p, r] = receiver_inputs(model, graph, clean, delta, w_S.expand(2, 1, n), n)[:, 0]
                plain[p, r] = receiver_inputs(model, graph, clean, None, None, n)[:, 0]
    return fast, general, plain


def largest_difference(fast: dict, general: dict, *_) -> float:
    assert fast.keys() == general.keys()
    return max(float((fast[key] - general[key]).abs().max()) for key in general)


@pytest.mark.parametrize("family", FAMILIES)
def test_fast_receiver_inputs_equal_the_general_formula(family):
    fast, general, plain = fast_and_general(family)
    scale = max(float(x.abs().max()) for x in general.values())
    assert largest_difference(fast, general) < 1e-12 * scale
    moved = min(float((plain[key] - general[key]).abs().max()) for key in general)
    assert moved > 1e-3  # the senders move every receiver's input: the two are not trivially equal


@pytest.mark.parametrize("family", ["llama3", "gemma3"])
def test_the_comparison_catches_a_wrong_sign(family, monkeypatch):
    change = pp.sender_change
    monkeypatch.setattr(pp, "sender_change", lambda *args: -change(*args))
    assert largest_difference(*fast_and_general(family)) > 1e-3


def test_the_comparison_catches_a_per_head_sum_under_post_norms(monkeypatch):
    """Gemma 3 normalises attention's output: adding each sender head's dz W_O, as a pre-norm family may, is wrong."""
    change = pp.sender_change

    def per_head_sum(model, *args):
        norms = [block.ln_attn_out for block in model.blocks]
        for block in model.blocks:
            block.ln_attn_out = None
        try:
            return change(model, *args)
        finally:
            for block, norm in zip(model.blocks, norms):
                block.ln_attn_out = norm

    monkeypatch.setattr(pp, "sender_change", per_head_sum)
    assert largest_difference(*fast_and_general("gemma3")) > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_running_streams_and_plain_forward_are_the_general_formulas_bits(family):
    """plain_streams (one running sum) and node_outputs (the plain forward as one running sum) make the same
    additions in the same order as receiver_inputs without weights and the edge-patched forward with no edge
    touched: equal to the bit, float32."""
    model = make_model(family, torch.float32)
    graph = Graph.of(model)
    clean_ids, _ = prompts(T=16)
    outs = node_outputs(model, clean_ids)
    counts = {graph.n_senders(r) for r in graph.receivers}
    streams = plain_streams(model, graph, outs, counts)
    for n in counts:
        assert torch.equal(streams[n], receiver_inputs(model, graph, outs, None, None, n)[:, 0]), n
    with torch.no_grad():
        weights = torch.zeros(1, len(graph.edges))  # every edge kept, through the general per-receiver path
        logits, general = edge_forward(model, model.embed(clean_ids), weights, outs)
    torch.testing.assert_close(logits, edge_forward(model, model.embed(clean_ids))[0], atol=1e-5, rtol=1e-5)
    for fast_z, general_z in zip(outs.z, general.z):
        torch.testing.assert_close(fast_z, general_z, atol=1e-5, rtol=1e-5)


def test_bench_path_patching_runs_on_a_tiny_model(tmp_path):
    """scripts/bench_path_patching.py (docs/BENCHMARKS.md's path-patching figures) still runs against the code it
    measures, and its --compare reads what its --save wrote (here the same run's: difference 0)."""
    import subprocess
    import sys
    from pathlib import Path

    scripts = Path(__file__).resolve().parents[1] / "scripts"
    saved = str(tmp_path / "effects.pt")
    command = [sys.executable, "bench_path_patching.py", "--model", "tiny", "--prompts", "4", "--senders", "5"]
    proc = subprocess.run([*command, "--save", saved, "--compare", saved], cwd=scripts, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "5 of the" in proc.stdout and "largest difference from" in proc.stdout and " 0 (summed" in proc.stdout

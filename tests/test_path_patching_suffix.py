"""Path patching's run at the changed positions only (model/suffix.py's SuffixRun, circuits/path_patching.py): the
same effects as the run over every position, in float64 to 1e-10, on every family the tests build, with prompts whose
first difference is at the start, in the middle and at the scored last token, for senders and receivers of every kind
(emb, heads, MLPs; q, k, v, MLP and logits inputs), and with several score points per prompt, one before the first
difference."""

import pytest
import torch
from test_suffix import LAYOUTS, MODELS, T, model_of, patch_batch

import headcount.circuits.path_patching as pp
from headcount.circuits import Graph, PointMetric, path_patch


def pairs_of(model) -> list[tuple[list[str], list[str]]]:
    """Pairs of every kind on the model's layers 0, 1 and its last."""
    graph = Graph.of(model)
    last, mlp = model.n_layers - 1, graph.mlp
    pairs = [
        (["L0H1"], ["L1H0.q"]),
        (["emb", "L0H0", "L0H2"], ["L1H1.k", f"L{last}H3.v"]),
        ([f"L{last - 1}H2"], [f"L{last}H0.q", f"L{last}H0.k", "logits"]),
        (["L0H3", f"L{last}H1"], ["logits"]),
    ]
    if mlp:
        pairs += [(["L0.mlp"], ["L1H2.v", "L1.mlp"]), (["emb", "L1.mlp"], ["logits"])]
    return pairs


def effects(model, batch, points, skipping: bool, monkeypatch) -> torch.Tensor:
    answer, wrong = batch["answer_ids"][points], batch["wrong_ids"][points]
    metric = PointMetric(
        lambda logits, a, w: logits[torch.arange(len(a)), a] - logits[torch.arange(len(a)), w], answer, wrong
    )
    with monkeypatch.context() as m:
        if not skipping:
            m.setattr(pp, "suffix_run", lambda *args: None)
        return path_patch(model, batch["input_ids"], batch["source_ids"], pairs_of(model), metric, points)


@pytest.mark.parametrize("where", list(LAYOUTS))
@pytest.mark.parametrize("name", MODELS)
def test_path_patching_at_the_changed_positions_equals_the_plain_run(name, where, monkeypatch):
    model = model_of(name)
    batch = patch_batch(*LAYOUTS[where], model.cfg.vocab_size)
    points = batch["score_mask"]
    calls = []
    suffix_run = pp.suffix_run
    monkeypatch.setattr(pp, "suffix_run", lambda *args: calls.append(suffix_run(*args)) or calls[-1])
    got = effects(model, batch, points, True, monkeypatch)
    if where != "start":
        assert calls and all(run is not None for run in calls)  # the test exercises the skipping
    expected = effects(model, batch, points, False, monkeypatch)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)
    assert (expected.abs() > 1e-6).all()  # every pair moves the metric: an equality of zeros would prove nothing


@pytest.mark.parametrize("name", ["gemma2", "gemma3", "llama_gqa_untied", "olmo2", "shortformer"])
def test_several_points_one_before_the_first_difference(name, monkeypatch):
    model = model_of(name)
    batch = patch_batch([6, 8], [11, 10], model.cfg.vocab_size)
    points = batch["score_mask"].clone()
    points[0, [2, 7, 9]] = True  # position 2 lies before the first difference: its value stays clean
    points[1, 9] = True
    got = effects(model, batch, points, True, monkeypatch)
    expected = effects(model, batch, points, False, monkeypatch)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)


def test_the_run_takes_the_positions_from_the_first_changed_output_to_the_last_point():
    model = model_of("llama_gqa_untied")
    batch = patch_batch([5, 3], [11, 8], model.cfg.vocab_size)
    graph = Graph.of(model)
    clean = pp.node_outputs(model, batch["input_ids"])
    corrupted = pp.node_outputs(model, batch["source_ids"])
    run = pp.suffix_run(model, graph, clean, corrupted, batch["score_mask"])
    assert run.layout.start_B.tolist() == [5, 3] and run.layout.end_B.tolist() == [12, 9] and run.layout.T == T
    # The first token already differs: only the positions after the last point are skipped, too few to bother.
    early = patch_batch([0, 1], [11, 11], model.cfg.vocab_size)
    corrupted = pp.node_outputs(model, early["source_ids"])
    assert (
        pp.suffix_run(model, graph, pp.node_outputs(model, early["input_ids"]), corrupted, early["score_mask"]) is None
    )


def test_float32_agrees_to_float32_rounding(monkeypatch):
    model = model_of("gemma3").float()
    batch = patch_batch(*LAYOUTS["middle"], model.cfg.vocab_size)
    got = effects(model, batch, batch["score_mask"], True, monkeypatch)
    expected = effects(model, batch, batch["score_mask"], False, monkeypatch)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)

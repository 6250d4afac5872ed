"""MIB's CPR and CMD (src/headcount/circuits/cpr.py): the sizes MIB evaluates, the trapezoid areas on made-up curves
and on a tiny model's real curve, each against a hand computation; a size off by one or a missing endpoint fails."""

import pandas as pd
import pytest
import torch
from test_circuits import VOCAB, logit_diff, make_model, prompts

from headcount.circuits.attribution import eap_scores
from headcount.circuits.cpr import (
    MIB_FRACTIONS,
    area_intervals,
    circuit_performance,
    curve_areas,
    method_areas,
    mib_areas,
    mib_points,
    mib_sizes,
    ranking_scores,
)
from headcount.circuits.faithfulness import faithfulness, faithfulness_curve, top_edges
from headcount.circuits.graph import Graph
from headcount.config.model import AttentionConfig, ModelConfig
from headcount.errors import ConfigError
from headcount.model.transformer import Transformer

# MIB's own percentages and the edge counts of its models (gpt2, qwen2.5, gemma2, llama3, interpbench)
MIB_PERCENTAGES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1)
MIB_EDGE_COUNTS = (32491, 179749, 74218, 1592881, 1108)


def test_sizes_are_mibs_int_of_fraction_times_edges():
    assert MIB_FRACTIONS == MIB_PERCENTAGES
    for n_edges in (*MIB_EDGE_COUNTS, *range(1, 3000)):
        assert mib_sizes(n_edges) == [int(p * n_edges) for p in MIB_PERCENTAGES], n_edges
    assert mib_sizes(81) == [0, 0, 0, 0, 1, 4, 8, 16, 40, 81]  # the quickstart's model, by hand
    assert mib_sizes(32491) == [32, 64, 162, 324, 649, 1624, 3249, 6498, 16245, 32491]  # GPT-2 small, by hand
    with pytest.raises(ConfigError, match="at least one edge"):
        mib_sizes(0)


def test_areas_equal_a_hand_computation_on_made_up_curves():
    f = [0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.1, 1.2, 1.0]  # crossing 1 between 10% and 20%
    # widths .001 .003 .005 .01 .03 .05 .1 .3 .5; mean f per trapezoid .05 .15 .25 .4 .6 .8 1 1.15 1.1
    # CPR = .00005 + .00045 + .00125 + .004 + .018 + .04 + .1 + .345 + .55
    # mean |1 - f| .95 .85 .75 .6 .4 .2 .1 .15 .1: CMD = .00095 + .00255 + .00375 + .006 + .012 + .01 + .01 + .045 + .05
    areas = curve_areas(MIB_FRACTIONS, f)
    assert areas["cpr"] == pytest.approx(1.05875, abs=1e-12)
    assert areas["cmd"] == pytest.approx(0.14025, abs=1e-12)
    perfect = curve_areas(MIB_FRACTIONS, [1.0] * 10)
    assert perfect == pytest.approx({"cpr": 0.999, "cmd": 0.0}, abs=1e-12)  # the x axis runs .001 .. 1, unnormalised
    assert curve_areas(MIB_FRACTIONS, [0.0] * 10) == pytest.approx({"cpr": 0.0, "cmd": 0.999}, abs=1e-12)
    # one point's weight is its two neighbouring half-widths: f = 1 at 50% alone adds (.3 + .5) / 2
    bump = [0.0] * 8 + [1.0, 0.0]
    assert curve_areas(MIB_FRACTIONS, bump) == pytest.approx({"cpr": 0.4, "cmd": 0.999 - 0.4}, abs=1e-12)


@pytest.mark.parametrize(
    "x, f, message",
    [
        ([0.1], [1.0], ">= 2"),
        ([0.1, 0.2], [1.0], "as many values"),
        ([0.2, 0.1], [1.0, 1.0], "increase strictly"),
        ([0.1, 0.2], [1.0, float("nan")], "finite"),
    ],
)
def test_bad_curves_are_one_line_errors(x, f, message):
    with pytest.raises(ConfigError, match=message):
        curve_areas(x, f)


def hand_curve(model, clean, corrupted, scores: torch.Tensor, sizes: list[int]) -> list[float]:
    """The faithfulness of the top-n circuit at each size, one circuit at a time."""
    graph = Graph.of(model)
    return [float(faithfulness(model, clean, corrupted, [top_edges(graph, scores, n)], logit_diff)[0]) for n in sizes]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_tiny_models_real_curve_equals_a_hand_computation(dtype):
    model = make_model("gpt2", dtype)  # 2 layers of 3 heads with MLPs: 75 edges
    clean, corrupted = prompts(batch=3)
    graph = Graph.of(model)
    assert len(graph.edges) == 75
    eap = eap_scores(model, clean, corrupted, logit_diff)
    points, areas = circuit_performance(model, clean, corrupted, {"eap": eap}, logit_diff)
    sizes = [0, 0, 0, 0, 1, 3, 7, 15, 37, 75]  # floor(p * 75) for MIB's percentages, by hand
    f = hand_curve(model, clean, corrupted, eap, sizes)
    tol = 1e-5 if dtype == torch.float32 else 1e-10  # the hand's circuits run in other passes: other roundings
    assert f[0] == pytest.approx(0.0, abs=tol) and f[-1] == pytest.approx(1.0, abs=tol)  # measured, both ends
    assert points["n"].tolist() == sizes
    assert points["faithfulness"].tolist() == pytest.approx(f, abs=tol)
    x = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0]
    cpr = sum((x[i + 1] - x[i]) * (f[i] + f[i + 1]) / 2 for i in range(9))
    cmd = sum((x[i + 1] - x[i]) * (abs(1 - f[i]) + abs(1 - f[i + 1])) / 2 for i in range(9))
    assert areas.loc[0, "cpr"] == pytest.approx(cpr, abs=tol)
    assert areas.loc[0, "cmd"] == pytest.approx(cmd, abs=tol)
    # the sizes matter: one edge more at each size gives another area on this model
    shifted = hand_curve(model, clean, corrupted, eap, [min(n + 1, 75) for n in sizes])
    assert abs(curve_areas(x, shifted)["cpr"] - cpr) > 1e-3


def test_a_curve_missing_a_size_is_an_error_not_a_filled_in_point():
    model = make_model("gpt2")
    clean, corrupted = prompts()
    eap = eap_scores(model, clean, corrupted, logit_diff)
    sizes = mib_sizes(75)
    curve = faithfulness_curve(model, clean, corrupted, {"eap": eap}, sorted(set(sizes)), logit_diff, random_draws=2)
    points = mib_points(curve, 75)
    assert sorted(points.groupby(["method", "draw"]).size().tolist()) == [10, 10, 10]
    areas = method_areas(mib_areas(points))
    assert set(areas) == {"eap", "random"} and {"cpr_min", "cpr_max"} <= set(areas["random"])
    with pytest.raises(ConfigError, match="lacks n = 75"):
        mib_points(curve[curve["n"] != 75], 75)  # the 100% endpoint missing
    with pytest.raises(ConfigError, match="lacks n = 0"):
        mib_points(curve[curve["n"] != 0], 75)


def test_a_ranking_scores_its_edges_in_order():
    graph = Graph.of(make_model("gpt2"))
    scores = ranking_scores(graph, [5, 2, 9])
    assert top_edges(graph, scores, 3) <= {5, 2, 9}
    assert scores[5] > scores[2] > scores[9] > 0 and scores.count_nonzero() == 3
    with pytest.raises(ConfigError, match="twice"):
        ranking_scores(graph, [1, 1])


def test_scores_of_the_wrong_length_are_refused():
    model = make_model("gpt2")
    clean, corrupted = prompts()
    with pytest.raises(ConfigError, match="one score per edge"):
        circuit_performance(model, clean, corrupted, {"mine": torch.zeros(3)}, logit_diff)


def test_random_draws_average_into_one_entry():
    areas = pd.DataFrame({"method": ["a", "random", "random"], "draw": [0, 0, 1], "cpr": [1, 2, 4], "cmd": [0, 1, 3]})
    entry = method_areas(areas)
    assert entry["a"] == {"cpr": 1.0, "cmd": 0.0}
    assert entry["random"] == {"cpr": 3.0, "cmd": 2.0, "cpr_min": 2.0, "cpr_max": 4.0, "cmd_min": 1.0, "cmd_max": 3.0}


def test_the_smallest_size_is_measured_where_it_holds_edges():
    """With 1281 edges MIB's 0.1% is one edge: its circuit is evaluated, not taken to be the empty one's 0."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_ctx=8, vocab_size=VOCAB, n_layers=4, mlp=False, attn=AttentionConfig(n_heads=8))
    model = Transformer(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    graph = Graph.of(model)
    assert len(graph.edges) == 1281 and mib_sizes(1281)[:2] == [1, 2]
    clean, _ = prompts(batch=2, T=6)
    corrupted = (clean + 1) % VOCAB  # the last token too: the embeddings' direct edge carries a difference
    scores = torch.zeros(len(graph.edges), dtype=torch.float64)
    scores[graph.edge_index["emb -> logits"]] = 1.0  # one edge that carries the embeddings to the logits
    points, _ = circuit_performance(model, clean, corrupted, {"direct": scores}, logit_diff)
    smallest = points.iloc[0]
    assert (smallest["n"], smallest["edges"]) == (1, 1)
    alone = faithfulness(model, clean, corrupted, [{graph.edge_index["emb -> logits"]}], logit_diff)[0]
    assert smallest["faithfulness"] == pytest.approx(float(alone), abs=1e-10) and abs(float(alone)) > 1e-3


def test_a_resamples_areas_are_the_areas_of_the_drawn_prompts():
    """CPR's interval reads each resample's curve: one resample (prompts 0, 0, 2, 3, 3, 3) is circuit_performance on
    those prompts; the resample of every prompt once is the full data's."""
    model = make_model("gpt2")
    clean, corrupted = prompts(batch=6, seed=4)
    eap = eap_scores(model, clean, corrupted, logit_diff)
    curve, sums = faithfulness_curve(
        model, clean, corrupted, {"eap": eap}, sorted(set(mib_sizes(75))), logit_diff, random_draws=0, per_example=True
    )
    drawn = torch.tensor([0, 0, 2, 3, 3, 3])
    counts = torch.bincount(drawn, minlength=6).double()[None]
    one = area_intervals(curve, sums, 75, counts).iloc[0]
    _, by_hand = circuit_performance(model, clean[drawn], corrupted[drawn], {"eap": eap}, logit_diff)
    # the same sums added in another order, divided by a gap that cancels: float64, relative 1e-7
    assert one["cpr_ci_low"] == pytest.approx(by_hand.loc[0, "cpr"], rel=1e-7) == one["cpr_ci_high"]
    assert one["cmd_ci_low"] == pytest.approx(by_hand.loc[0, "cmd"], rel=1e-7)
    whole = area_intervals(curve, sums, 75, torch.ones(1, 6, dtype=torch.float64)).iloc[0]
    full = mib_areas(mib_points(curve, 75)).iloc[0]
    assert (whole["cpr_ci_low"], whole["cmd_ci_high"]) == pytest.approx((full["cpr"], full["cmd"]), rel=1e-7)
    _, areas = circuit_performance(model, clean, corrupted, {"eap": eap}, logit_diff, resamples=300)
    row = areas.iloc[0]
    assert row["cpr_ci_low"] <= row["cpr"] <= row["cpr_ci_high"] and row["cpr_ci_low"] < row["cpr_ci_high"]
    assert row["cmd_ci_low"] <= row["cmd"] <= row["cmd_ci_high"]

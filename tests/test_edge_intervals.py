"""Uncertainty of the edge scores and of the attention-pattern head scores (issue 36, item 3): one bootstrap resample
of each is the score computed on the prompts it draws (float64, 1e-9), the intervals cover the full data's score and
narrow from 16 to 256 prompts, and an edge circuit's top edges are compared across seeds of the task generator by
|circuit_by| (ablation/task_seeds.py)."""

import pandas as pd
import pytest
import torch
from test_circuits import logit_diff, make_model, prompts
from test_score_intervals import batches_of, head_task

from headcount.ablation.scans.head_scores import head_pattern_scores, head_pattern_sums
from headcount.ablation.scans.intervals import score_intervals
from headcount.ablation.scans.retrieval_scores import score_intervals as retrieval_intervals
from headcount.ablation.task_seeds import seed_stability, top_edges
from headcount.circuits.attribution import eap_ig_scores, eap_scores, exact_edge_scores
from headcount.circuits.bootstrap import percentile_interval, resample_counts
from headcount.circuits.bootstrap import score_intervals as edge_intervals
from headcount.errors import ConfigError
from headcount.tasks import TaskPrompt

EDGE_SCORES = {"eap": (eap_scores, {}), "eap_ig": (eap_ig_scores, {"steps": 3}), "exact": (exact_edge_scores, {})}


def drawn_prompts(n_prompts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One resample's counts (P,) that draws a prompt more than once and leaves one out (the first seed that does),
    and the indices of the prompts it draws, each as often as it is drawn."""
    counts = next(c for seed in range(100) if (c := resample_counts(n_prompts, 1, seed)[0]).max() > 1)
    return counts, torch.arange(n_prompts).repeat_interleave(counts.long())


def pattern_task(n_prompts: int, seed: int = 0) -> tuple:
    """head_task's model with prompts of 6 tokens out of 7, so that tokens repeat and induction targets exist."""
    model, _ = head_task(1)
    g = torch.Generator().manual_seed(seed)
    return model, [TaskPrompt(torch.randint(1, 8, (6,), generator=g).tolist(), [9], [4]) for _ in range(n_prompts)]


def test_one_resample_of_each_edge_score_is_the_score_on_the_prompts_it_draws():
    """The scan's intervals (bootstrap.score_intervals over the per-prompt contributions the edge scan keeps) with one
    resample: both ends are EAP's, EAP-IG's and the exact score computed on the drawn prompts (a prompt drawn twice,
    one never) over their points, in float64."""
    model = make_model("gpt2", torch.float64)
    clean, corrupted = prompts(batch=6, seed=2)
    counts, drawn = drawn_prompts(6)
    assert counts.max() > 1 and counts.min() == 0
    points = torch.ones(6, dtype=torch.float64)  # logit_diff: one score point per prompt
    per_example = {
        name: score(model, clean, corrupted, logit_diff, **kwargs, per_example=True)
        for name, (score, kwargs) in EDGE_SCORES.items()
    }
    intervals = edge_intervals(per_example, points, counts[None], 0.95)
    for name, (score, kwargs) in EDGE_SCORES.items():
        on_drawn = score(model, clean[drawn], corrupted[drawn], logit_diff, **kwargs) / len(drawn)
        low, high = intervals[name]
        torch.testing.assert_close(low, on_drawn, rtol=0, atol=1e-9)
        torch.testing.assert_close(high, on_drawn, rtol=0, atol=1e-9)


def test_edge_intervals_cover_the_scores_and_narrow_from_16_to_256_prompts():
    model = make_model("gpt2", torch.float64)
    clean, corrupted = prompts(batch=256, seed=3)
    widths = {}
    for n in (16, 256):
        per_example = eap_scores(model, clean[:n], corrupted[:n], logit_diff, per_example=True)
        full = per_example.sum(0) / n
        low, high = percentile_interval(per_example, torch.ones(n, dtype=torch.float64), resample_counts(n, 1000), 0.95)
        assert ((low <= full + 1e-12) & (full <= high + 1e-12)).all()
        widths[n] = high - low
    moving = widths[16] > 1e-9  # an edge no prompt moves has no width to lose
    assert moving.float().mean() > 0.9
    # 16 times the prompts: about a quarter of the width; at most half for nearly every edge
    assert (widths[256][moving] < widths[16][moving] / 2).float().mean() > 0.95
    assert (widths[256][moving] / widths[16][moving]).median() < 0.4


def edge_table(scores: dict[str, float], by: str = "exact") -> pd.DataFrame:
    return pd.DataFrame({"edge": list(scores), "exact": list(scores.values()), "circuit_by": by})


def test_an_edge_circuit_is_compared_across_seeds_by_its_top_edges_by_magnitude():
    """Each seed's top n edges by |circuit_by| (a negative edge counts by its size), largest first, and each two
    seeds' overlap |top_a & top_b| / n."""
    tables = {
        1: edge_table({"a": 3.0, "b": -2.0, "c": 0.5, "d": 0.1}),
        2: edge_table({"a": 0.2, "b": -4.0, "c": 1.0, "d": 0.3}),
        3: edge_table({"a": -1.0, "b": 0.0, "c": 0.0, "d": 2.0}),
    }
    assert top_edges(tables[1], 2) == ["a", "b"] and top_edges(tables[2], 2) == ["b", "c"]
    pairs, summary = seed_stability(tables, n=2)
    assert summary["tops"] == {1: ["a", "b"], 2: ["b", "c"], 3: ["d", "a"]} and summary["by"] == "|exact|"
    assert pairs["overlap"].tolist() == [0.5, 0.5, 0.0]
    assert summary["mean_overlap"] == pytest.approx(1 / 3) and summary["min_overlap"] == 0.0
    eap_ig = {s: t.assign(eap_ig=t["exact"][::-1].to_numpy(), circuit_by="eap_ig") for s, t in tables.items()}
    assert seed_stability(eap_ig, n=1)[1]["tops"][1] == ["d"]  # the column circuit_by names ranks them
    with pytest.raises(ConfigError, match="^n=5: the top n compared"):
        seed_stability(tables, n=5)


# --- the attention-pattern scores (head_scores, retrieval_scores) -----------------------------------------------------


def test_one_resample_of_the_pattern_scores_is_the_scan_on_the_sequences_it_draws():
    model, task = pattern_task(7)
    counts, drawn = drawn_prompts(7)
    assert counts.max() > 1 and counts.min() == 0
    sums = head_pattern_sums(model, batches_of(task))
    full = head_pattern_scores(model, batches_of(task))
    on_drawn = head_pattern_scores(model, batches_of([task[i] for i in drawn.tolist()], 3))
    for score, (contributions_PK, points_P) in sums.items():
        assert contributions_PK.dtype == torch.float64 and points_P.sum() > 0
        one = score_intervals(contributions_PK, points_P, score, 0, magnitude=False)[0]  # the scan's own columns
        assert one[f"{score}_ci_low"].shape == (8,)
        torch.testing.assert_close(contributions_PK.sum(0) / points_P.sum(), torch.tensor(full[score].to_numpy()))
        low, high = percentile_interval(contributions_PK, points_P, counts[None], 0.95)
        expected = torch.tensor(on_drawn[score].to_numpy())
        torch.testing.assert_close(low, expected, rtol=0, atol=1e-9)
        torch.testing.assert_close(high, expected, rtol=0, atol=1e-9)


def test_pattern_score_intervals_cover_the_scores_and_narrow_from_16_to_256_sequences():
    widths = {}
    for n in (16, 256):
        model, task = pattern_task(n)  # the 16 sequences are the 256's first
        for score, (contributions_PK, points_P) in head_pattern_sums(model, batches_of(task)).items():
            columns, entry = score_intervals(contributions_PK, points_P, score, 0, magnitude=False)
            value = (contributions_PK.sum(0) / points_P.sum()).numpy()
            assert (columns[f"{score}_ci_low"] <= value + 1e-12).all()
            assert (value <= columns[f"{score}_ci_high"] + 1e-12).all()
            assert entry["by"] == score and entry["top_n"] == 1
            assert 0 <= entry["min_overlap"] <= entry["mean_overlap"] <= 1
            widths[n, score] = columns[f"{score}_ci_high"] - columns[f"{score}_ci_low"]
    for score in ("prev_token_score", "induction_score"):  # 16 times the sequences: about a quarter of the width
        ratio = widths[256, score] / widths[16, score]
        assert (ratio < 0.6).all() and ratio.mean() < 0.4


def test_retrieval_score_intervals_cover_narrow_and_share_the_planted_top():
    """retrieval_scores' columns on planted hits: 20 heads, head k copying each token with chance k / 20."""

    def planted(n_prompts: int):
        g = torch.Generator().manual_seed(0)
        points_P = torch.randint(1, 4, (n_prompts,), generator=g).double()
        chance_K = torch.arange(20, dtype=torch.float64) / 20
        hits_PK = torch.binomial(points_P[:, None].expand(-1, 20), chance_K.expand(n_prompts, -1), generator=g)
        return hits_PK.sum(0) / points_P.sum(), retrieval_intervals(hits_PK, points_P, seed=0)

    widths = []
    for n in (16, 256):
        value, columns = planted(n)
        assert (columns["retrieval_score_ci_low"] <= value.numpy()).all()
        assert (value.numpy() <= columns["retrieval_score_ci_high"]).all()
        widths.append(columns["retrieval_score_ci_high"] - columns["retrieval_score_ci_low"])
    moving = widths[0] > 0  # head 0 never copies: no width
    assert (widths[1][moving] < widths[0][moving] / 2).all()
    assert columns["top_share"][-1] > 0.9 and columns["top_share"].sum() == pytest.approx(1.0)  # top 5%: one head

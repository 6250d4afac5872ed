"""The bootstrap over prompts (src/headcount/circuits/bootstrap.py) and the per-example edge scores it resamples:
resamples draw prompts with replacement, a resample's score equals the one recomputed by hand from the drawn prompts,
intervals cover the full-data value and shrink with more prompts, top-n stability, and per-example exact, EAP and
EAP-IG scores that add up to the scores (float32 and float64)."""

import pytest
import torch
from test_circuits import logit_diff, make_model, prompts

from headcount.circuits.attribution import eap_ig_scores, eap_scores, exact_edge_scores
from headcount.circuits.bootstrap import bootstrap_scores, percentile_interval, resample_counts, top_n_stability
from headcount.errors import ConfigError


def made_up(n_prompts: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Contributions of 3 items from prompts of 1 to 3 points each, item k's per-point mean k."""
    g = torch.Generator().manual_seed(seed)
    points_P = torch.randint(1, 4, (n_prompts,), generator=g).double()
    per_point = torch.arange(3.0, dtype=torch.float64) + torch.randn(n_prompts, 3, generator=g, dtype=torch.float64)
    return per_point * points_P[:, None], points_P


def test_resamples_draw_prompts_with_replacement_seeded():
    counts = resample_counts(50, 200, seed=3)
    assert counts.shape == (200, 50) and torch.equal(counts.sum(1), torch.full((200,), 50.0, dtype=torch.float64))
    assert torch.equal(counts, resample_counts(50, 200, seed=3)) and not torch.equal(counts, resample_counts(50, 200))
    assert (counts == 0).any(1).all() and (counts >= 2).any(1).all()  # with replacement: some prompts out, some twice
    # a prompt's share of the draws is 1/P on average: 1 per resample
    assert counts.mean() == pytest.approx(1.0) and counts.mean(0).sub(1).abs().max() < 0.35
    with pytest.raises(ConfigError, match="resample"):
        resample_counts(5, 0)


def test_a_resamples_score_is_the_drawn_prompts_score_by_hand():
    contributions, points = made_up(7)
    g = torch.Generator().manual_seed(1)
    drawn = [torch.randint(0, 7, (7,), generator=g) for _ in range(4)]
    counts = torch.stack([torch.bincount(d, minlength=7).double() for d in drawn])
    by_hand = torch.stack([contributions[d].sum(0) / points[d].sum() for d in drawn])
    torch.testing.assert_close(bootstrap_scores(contributions, points, counts), by_hand, rtol=0, atol=1e-12)
    with pytest.raises(ConfigError, match="one count per prompt"):
        bootstrap_scores(contributions, points, counts[:, :6])


def test_intervals_cover_the_full_data_value_and_shrink_with_more_prompts():
    widths = []
    for n_prompts in (25, 400):
        contributions, points = made_up(n_prompts)
        full = contributions.sum(0) / points.sum()
        low, high = percentile_interval(contributions, points, resample_counts(n_prompts, 1000), 0.95)
        assert ((low <= full) & (full <= high)).all()
        assert (high - low > 0).all()
        widths.append(high - low)
    assert (widths[1] < widths[0] / 2).all()  # 16 times the prompts: about a quarter of the width
    # a level-L interval holds the middle L of the resampled scores
    resampled = bootstrap_scores(contributions, points, resample_counts(400, 1000))
    inside = ((resampled >= low) & (resampled <= high)).double().mean(0)
    assert inside.sub(0.95).abs().max() <= 0.002
    narrow = percentile_interval(contributions, points, resample_counts(400, 1000), 0.5)
    assert ((narrow[1] - narrow[0]) < widths[1]).all()
    with pytest.raises(ConfigError, match="between 0 and 1"):
        percentile_interval(contributions, points, resample_counts(400, 10), 95)


def test_items_taken_some_at_a_time_give_the_same_intervals(monkeypatch):
    contributions, points = made_up(30)
    counts = resample_counts(30, 100)
    whole = percentile_interval(contributions, points, counts)
    monkeypatch.setattr("headcount.circuits.bootstrap.CHUNK", 150)  # one item, one resample row at a time
    split = percentile_interval(contributions, points, counts)
    for a, b in zip(whole, split):  # other matrix shapes: the same sums up to their rounding
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    monkeypatch.undo()
    whole_stability = top_n_stability(contributions, points, counts, 1)
    monkeypatch.setattr("headcount.circuits.bootstrap.CHUNK", 3)
    split_stability = top_n_stability(contributions, points, counts, 1)
    assert whole_stability["mean_overlap"] == split_stability["mean_overlap"] > 0.5
    assert torch.equal(whole_stability["inclusion"], split_stability["inclusion"])


def test_top_n_stability_counts_the_resamples_that_keep_the_top():
    # item 2 is always largest; items 0 and 1 trade places prompt by prompt
    contributions = torch.tensor([[3.0, 0.0, 9.0], [0.0, 3.0, 9.0], [1.0, 1.0, 9.0]], dtype=torch.float64)
    points = torch.ones(3, dtype=torch.float64)
    counts = torch.tensor([[1.0, 1, 1], [3, 0, 0], [0, 3, 0], [2, 0, 1]], dtype=torch.float64)
    one = top_n_stability(contributions, points, counts, 1)
    assert one["mean_overlap"] == 1.0 and one["inclusion"].tolist() == [0.0, 0.0, 1.0]
    two = top_n_stability(contributions, points, counts, 2)
    # full data: item 0 ties item 1 (4 and 4); argsort puts one of them in the top 2 beside item 2
    assert two["inclusion"][2] == 1.0 and two["inclusion"][:2].sum() == pytest.approx(1.0)
    assert two["min_overlap"] == 0.5
    with pytest.raises(ConfigError, match="1..3"):
        top_n_stability(contributions, points, counts, 4)


@pytest.mark.parametrize(
    "family, dtype",
    [
        ("gpt2", torch.float32),
        ("gpt2", torch.float64),
        pytest.param("gemma2", torch.float64, marks=pytest.mark.slow),  # post-norms: the J^T g products per example
    ],
)
def test_per_example_edge_scores_add_up_to_the_scores(family, dtype):
    model = make_model(family, dtype)
    clean, corrupted = prompts(batch=3)
    tol = 1e-4 if dtype == torch.float32 else 1e-12
    for score, kwargs in ((eap_scores, {}), (eap_ig_scores, {"steps": 3}), (exact_edge_scores, {})):
        full = score(model, clean, corrupted, logit_diff, **kwargs)
        split = score(model, clean, corrupted, logit_diff, **kwargs, per_example=True, memory_budget=1)
        assert split.shape == (3, len(full))
        torch.testing.assert_close(split.sum(0), full, rtol=tol, atol=tol)
        alone = score(model, clean[1:2], corrupted[1:2], logit_diff, **kwargs)
        torch.testing.assert_close(split[1], alone, rtol=tol, atol=tol)


def test_the_top_n_is_the_stable_sorts_first_n_ties_lowest_index_first():
    """in_top (each resample's top n, found from the n-th largest value) against a stable sort's first n, on random
    scores and on small integers full of ties."""
    from headcount.circuits.bootstrap import in_top

    g = torch.Generator().manual_seed(0)
    for trial in range(100):
        K = int(torch.randint(3, 60, (1,), generator=g))
        n = int(torch.randint(1, K + 1, (1,), generator=g))
        if trial % 2:
            scores = torch.randint(0, 4, (5, K), generator=g).double()
        else:
            scores = torch.randn(5, K, generator=g, dtype=torch.float64)
        first_n = scores.argsort(dim=1, descending=True, stable=True)[:, :n]
        expected = torch.zeros(5, K, dtype=torch.bool).scatter_(1, first_n, True)
        assert torch.equal(in_top(scores, n), expected)
        assert (in_top(scores, n).sum(1) == n).all()

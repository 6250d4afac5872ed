"""Are sixteen heads really better than one, and at what cost? Vaswani et al. (2017, Table 3 A) found one head worse
than 8 at flat cost and too many heads worse again; Michel et al. (2019) asked whether the 16 are needed at all."""

from pathlib import Path

from headcount.findings import figures
from headcount.findings.claims import FINDINGS, Claim, Finding, FindingChecker, verdict
from headcount.findings.sweep_runs import finished_runs, mean_over_seeds, seed_noise
from headcount.report.figures import sweep_subject

PAPER = "Vaswani et al. 2017 (Table 3 A); Michel et al. 2019"
HEADS, WIDTH, LOSS = "model.attn.n_heads", "model.attn.head_dim", "test/loss"


def check(sweep_dir: Path, out: Path) -> Finding:
    runs = finished_runs(sweep_dir)
    # head_dim=null is the flat cost (d_model / n_heads); a number is a fixed head width
    runs["heads"] = runs[WIDTH].map(lambda w: "flat" if w is None or w != w else f"fixed {int(w)}")
    loss = mean_over_seeds(runs, ["data", "heads", HEADS], LOSS)
    params = mean_over_seeds(runs, ["data", "heads", HEADS], "params")
    datasets = sorted(runs["data"].unique())
    fixed_width = next(w for w in runs.heads.unique() if w != "flat")
    flat = {d: loss[d]["flat"] for d in datasets}  # n_heads -> mean test loss
    fixed = {d: loss[d][fixed_width] for d in datasets}
    numbers = {
        "runs": len(runs),
        "test_loss": {d: {w: loss[d][w].to_dict() for w in ("flat", fixed_width)} for d in datasets},
        "params": {d: {w: params[d][w].to_dict() for w in ("flat", fixed_width)} for d in datasets},
    }
    noise = seed_noise(runs, ["data", "heads", HEADS], LOSS)
    numbers["seed_noise"] = noise.to_dict()
    most = max(flat[datasets[0]].index)

    def lower(d: str, a: float, b: float) -> bool:
        """a is lower than b by more than the seed-to-seed spread on dataset d."""
        return a + noise[d] < b

    more_better = [d for d in datasets if lower(d, flat[d][most], flat[d][1])]
    one_worse = [d for d in datasets if lower(d, flat[d].min(), flat[d][1])]
    too_many = [d for d in datasets if lower(d, flat[d].min(), flat[d][most])]
    wider_better = [d for d in datasets if lower(d, fixed[d][most], flat[d][most])]

    def each(values: dict) -> str:
        return "; ".join(f"{d}: " + ", ".join(f"{n}h {v:.3f}" for n, v in values[d].items()) for d in datasets)

    def share(found: list[str]) -> str:
        return verdict(len(found) == len(datasets), partly=bool(found))

    claims = [
        Claim(
            f"{most} heads are better than one at the same attention width",
            f"test loss at flat cost, mean over seeds: {each(flat)}; a difference counts when larger than the "
            "seed-to-seed spread: " + ", ".join(f"{d} {noise[d]:.3f}" for d in datasets),
            share(more_better),
        ),
        Claim(
            "One head is worse than the best number of heads (Vaswani et al. Table 3 A)",
            f"one head worse than the best on {len(one_worse)} of {len(datasets)} datasets ({', '.join(one_worse)})",
            share(one_worse),
        ),
        Claim(
            "Too many heads at the same width hurt again (Vaswani et al. Table 3 A: 32 heads worse than 16)",
            f"{most} heads worse than the best on {len(too_many)} of {len(datasets)} ({', '.join(too_many)})",
            share(too_many),
        ),
        Claim(
            "Heads wider than the flat cost buy loss, at a price in parameters",
            f"{fixed_width} dimensions a head: {each(fixed)}; parameters at {most} heads "
            + ", ".join(
                f"{d}: {params[d][fixed_width][most]:,.0f} against {params[d]['flat'][most]:,.0f}" for d in datasets
            ),
            share(wider_better),
        ),
    ]
    figure = figures.loss_against_heads(loss, out / "head_count.png", sweep_subject(runs, sweep_dir))
    return Finding("head_count", PAPER, claims, numbers, [figure])


FINDINGS.register(
    FindingChecker(
        "head_count", check, "sweep", (), "Vaswani et al. 2017; Michel et al. 2019: how many heads a layer needs"
    )
)

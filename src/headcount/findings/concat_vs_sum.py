"""Concatenated heads against summed heads. Summing is concatenation with every head's output projection tied to one
shared matrix (docs/DESIGN.md), so at equal width it can only lose; the question is by how much, whether giving the
summed heads the parameters back closes the gap, and which of the two leaves more heads to prune."""

from pathlib import Path

import pandas as pd

from headcount.findings import figures
from headcount.findings.claims import FINDINGS, Claim, Finding, FindingChecker, verdict
from headcount.findings.sweep_runs import finished_runs, mean_over_seeds, seed_noise
from headcount.report.figures import sweep_subject

PAPER = "Vaswani et al. 2017 (concatenated heads) against summed heads"
COMBINE, WIDTH, LOSS, PRUNABLE = "model.attn.combine", "model.attn.head_dim", "test/loss", "prunable_fraction/gradient"


def check(sweep_dir: Path, out: Path) -> Finding:
    runs = finished_runs(sweep_dir)
    if PRUNABLE not in runs:  # every run's gradient order was arbitrary (tracking.summary_headline): no fraction
        runs[PRUNABLE] = float("nan")
    keys = ["data", COMBINE, WIDTH]
    loss, params = mean_over_seeds(runs, keys, LOSS), mean_over_seeds(runs, keys, "params")
    prunable = mean_over_seeds(runs, keys, PRUNABLE)
    datasets = sorted(runs["data"].unique())
    narrow, wide = sorted(runs[WIDTH].unique())  # equal width; about equal parameters for the summed heads
    noise = seed_noise(runs, keys, LOSS)  # a difference counts when larger than the seed-to-seed spread
    sum_loses = [d for d in datasets if loss[d]["concat"][narrow] + noise[d] < loss[d]["sum"][narrow]]
    gap_closes = [
        d
        for d in datasets
        if abs(loss[d]["sum"][wide] - loss[d]["concat"][narrow]) + noise[d]
        < abs(loss[d]["sum"][narrow] - loss[d]["concat"][narrow])
    ]
    numbers = {
        "runs": len(runs),
        "seed_noise": noise.to_dict(),
        "test_loss": {d: {c: loss[d][c].to_dict() for c in ("concat", "sum")} for d in datasets},
        "params": {d: {c: params[d][c].to_dict() for c in ("concat", "sum")} for d in datasets},
        "prunable_fraction_gradient": {d: {c: prunable[d][c].to_dict() for c in ("concat", "sum")} for d in datasets},
    }

    def row(d: str, combine: str, width: int) -> str:
        fraction = prunable[d][combine][width]
        pruned = "no prunable fraction (arbitrary gradient order)" if pd.isna(fraction) else f"{fraction:.0%} prunable"
        return (
            f"{combine} {width}d: loss {loss[d][combine][width]:.3f}, {params[d][combine][width]:,.0f} params, {pruned}"
        )

    def share(found: list[str]) -> str:
        return verdict(len(found) == len(datasets), partly=bool(found))

    table = "; ".join(
        f"{d}: {row(d, 'concat', narrow)}, {row(d, 'sum', narrow)}, {row(d, 'sum', wide)}" for d in datasets
    )
    claims = [
        Claim(
            f"At equal width ({narrow} dimensions a head) summed heads lose to concatenated heads",
            f"summed worse on {len(sum_loses)} of {len(datasets)} datasets (by more than the seed spread: "
            + ", ".join(f"{d} {noise[d]:.3f}" for d in datasets)
            + f"). {table}",
            share(sum_loses),
        ),
        Claim(
            f"At about equal parameters (summed heads {wide} dimensions wide) the gap narrows",
            f"narrower on {len(gap_closes)} of {len(datasets)} datasets ({', '.join(gap_closes)})",
            share(gap_closes),
        ),
    ]
    figure = figures.combine_bars(loss, prunable, out / "concat_vs_sum.png", sweep_subject(runs, sweep_dir))
    return Finding("concat_vs_sum", PAPER, claims, numbers, [figure])


FINDINGS.register(FindingChecker("concat_vs_sum", check, "sweep", ("pruning",), "concatenated against summed heads"))

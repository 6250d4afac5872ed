"""What the ratio and per-head score intervals cost on top of a scan (ablation/scans/intervals.py): from per-prompt
sums of the sizes a scan keeps (33 masks or 32 heads, 128 or 1024 prompts, 1000 resamples), the CPU seconds of
gap_fraction's interval (the gap resampled with the delta), head_circuit's faithfulness interval and a per-head score's
interval with its top-5% stability (direct_effect, attribution, importance), head_scores' two attention-pattern scores'
intervals with their stability (32 heads), and an edge scan's: the intervals of EAP, EAP-IG and exact scores of
--edges edges (SmolLM2-135M's 123,211 by default) and its circuit's stability over the same resamples (top 20 edges), at
128 prompts. The sums are random: the cost depends on the sizes only. CPU seconds of this process
(time.process_time), the fastest of --repeats.

    python scripts/bench_score_intervals.py [--repeats 3] [--edges 123211]
"""

import argparse
import time

import torch

from headcount.ablation.engine.evaluation import CounterpartSums
from headcount.ablation.scans.intervals import ExampleSums, gap_fraction_interval, score_intervals
from headcount.circuits.bootstrap import LEVEL, RESAMPLES, resample_counts, top_n_stability
from headcount.circuits.bootstrap import score_intervals as edge_score_intervals


def fastest(work, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.process_time()
        work()
        times.append(time.process_time() - start)
    return min(times)


def measure(n_prompts: int, repeats: int, g: torch.Generator) -> str:
    points = torch.ones(n_prompts, dtype=torch.float64)
    masks = torch.randn(33, n_prompts, generator=g, dtype=torch.float64)
    clean = torch.randn(n_prompts, generator=g, dtype=torch.float64)
    sums = ExampleSums(masks, clean, points, resample_counts(n_prompts, RESAMPLES, 0))
    counterpart = CounterpartSums({}, torch.randn(n_prompts, generator=g, dtype=torch.float64) + 3, points)
    gap = fastest(lambda: gap_fraction_interval(sums, counterpart), repeats)
    none = masks[-1]
    faithful = fastest(lambda: sums.share_interval(masks - none[None], clean - none, points), repeats)
    heads = torch.randn(n_prompts, 32, generator=g, dtype=torch.float64)
    per_head = fastest(lambda: score_intervals(heads, points, "score", 0), repeats)
    patterns = fastest(lambda: [score_intervals(heads, points, s, 0, magnitude=False) for s in ("a", "b")], repeats)
    return (
        f"{n_prompts} prompts: gap_fraction {gap:.4f} s, faithfulness {faithful:.4f} s, per-head {per_head:.4f} s, "
        f"head_scores' two {patterns:.4f} s"
    )


def measure_edges(n_edges: int, n_prompts: int, repeats: int, g: torch.Generator) -> str:
    """An edge scan's bootstrap from its per-prompt tables: three scores' intervals, then its top 20's stability."""
    points = torch.ones(n_prompts, dtype=torch.float64)
    tables = {name: torch.randn(n_prompts, n_edges, generator=g, dtype=torch.float64) for name in ("a", "b", "c")}
    counts = resample_counts(n_prompts, RESAMPLES, 0)
    intervals = fastest(lambda: edge_score_intervals(tables, points, counts, LEVEL), repeats)
    stability = fastest(lambda: top_n_stability(tables["a"], points, counts, min(20, n_edges)), repeats)
    sizes = f"{n_edges} edges, {n_prompts} prompts"
    return f"{sizes}: 3 scores' intervals {intervals:.3f} s, top-20 stability {stability:.3f} s"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--edges", type=int, default=123_211)  # SmolLM2-135M's edges
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {RESAMPLES} resamples")
    for n_prompts in (128, 1024):
        print(measure(n_prompts, args.repeats, g))
    print(measure_edges(args.edges, 128, args.repeats, g))


if __name__ == "__main__":
    main()

"""How stable a head scan's top heads are across seeds of the task generator (`ablation.task_seeds`, and
`Run.seed_stability` from Python): the scan run on the task regenerated with each seed (task.seed = s, each in its
own results folder `<task>_seed<s>`), each seed's top n heads by damage (how much a head's removal worsens the
metric: headcount's sign for every metric), and the overlap |top_a & top_b| / n of every two seeds' tops, with their
mean and lowest. Beside the bootstrap's stability over resamples of one seed's prompts (ablation/scans/intervals.py),
this is the other half of "the circuit is stable": prompts drawn anew, not resampled.

An edge_attribution table's items are its edges: each seed's top n by |score| of the score its circuit is chosen by
(`circuit_by`: exact where every edge is exact, else EAP-IG), n the scan's circuit_size (the n whose bootstrap
stability edge_circuits.<scan>.stability reports), over the table's edges (all, or those into its receivers).

Written by headcount-ablate beside each mask scan's (and edge_attribution scan's) table in the base task's folder:
<scan>_seed_stability.csv (a row per two seeds: seed_a, seed_b, overlap), <scan>_seed_stability.png (the overlaps as
a seed-by-seed grid) and summary.json's `seed_stability` entry (n, by, seeds, tops, mean_overlap, min_overlap).
"""

import dataclasses
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd

from headcount.ablation.engine.metrics import table_metric
from headcount.ablation.scans.intervals import top_n
from headcount.circuits.bootstrap import top_n_overlap
from headcount.config.task import TaskConfig
from headcount.errors import ConfigError
from headcount.plotting import heatmap
from headcount.tasks import task_name

KEY = "ablation.task_seeds"


def check_task_seeds(seeds: object, key: str = KEY) -> list[int]:
    """The seeds as a list of ints; ConfigError unless they are at least two different integers >= 0."""
    allowed = "a list of at least two different seeds of the task generator (integers >= 0), e.g. [0,1,2]"
    if isinstance(seeds, (str, bytes)) or not hasattr(seeds, "__iter__"):
        raise ConfigError(key, seeds, allowed)
    seeds = list(seeds)
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds) or len(set(seeds)) < 2:
        raise ConfigError(key, seeds, allowed)
    return seeds


def check_generated(task: TaskConfig | None, key: str = KEY, seeds: object = None) -> None:
    """ConfigError unless the task is one a generator draws (a prompts file or a Hub dataset has no seed)."""
    if task is None or task.source == "file" or task.hub_name is not None:
        what = "the run's own data (no task)" if task is None else f"task.source={task.source}, which has no seed"
        raise ConfigError(
            key, seeds, f"regenerates the task with each seed: needs a generated task (ioi, ...), not {what}"
        )


def seeded_task(base: TaskConfig, seed: int) -> TaskConfig:
    """The task regenerated with `seed`, in its own results folder <task>_seed<seed>."""
    return dataclasses.replace(base, seed=seed, name=f"{task_name(base)}_seed{seed}")


def top_heads(table: pd.DataFrame, n: int) -> list[str]:
    """A head scan's n masks of largest damage, largest first (ties by the table's order)."""
    metric = table_metric(table)
    damage = metric.damage(table[f"delta_{metric.primary}"].astype(float), 0.0)
    return table.loc[damage.sort_values(ascending=False, kind="stable").index[:n], "mask"].astype(str).tolist()


def top_edges(table: pd.DataFrame, n: int) -> list[str]:
    """An edge table's n edges of largest |circuit_by| (its circuit's score), largest first (ties by the table's
    order)."""
    score = table[str(table["circuit_by"].iloc[0])].astype(float).abs()
    return table.loc[score.sort_values(ascending=False, kind="stable").index[:n], "edge"].astype(str).tolist()


def is_edge_table(table: pd.DataFrame) -> bool:
    return "edge" in table.columns and "circuit_by" in table.columns


def ranked_by(table: pd.DataFrame) -> str:
    return f"|{table['circuit_by'].iloc[0]}|" if is_edge_table(table) else "damage"


def seed_stability(tables: dict[int, pd.DataFrame], n: int | None = None) -> tuple[pd.DataFrame, dict]:
    """(pairs, summary) from one scan's table per seed: a row per two seeds (seed_a, seed_b, overlap) and {n, by,
    seeds, tops (seed -> its top n), mean_overlap, min_overlap}. A head scan's tops are its heads by damage, an edge
    scan's its edges by |circuit_by| (`top_edges`). n: default 5% of the scan's rows (at least 1), as a head scan's
    own bootstrap stability (an edge scan's is over its circuit_size: headcount-ablate and Run.seed_stability pass
    that)."""
    first = next(iter(tables.values()))
    top = top_edges if is_edge_table(first) else top_heads
    if n is not None and not 1 <= n <= min(len(table) for table in tables.values()):
        raise ConfigError("n", n, f"the top n compared: 1 .. the {min(len(t) for t in tables.values())} rows scored")
    tops = {seed: top(table, n or top_n(len(table))) for seed, table in tables.items()}
    rows = [{"seed_a": a, "seed_b": b, "overlap": top_n_overlap(tops[a], tops[b])} for a, b in combinations(tops, 2)]
    pairs = pd.DataFrame(rows, columns=["seed_a", "seed_b", "overlap"])
    summary = {
        "n": len(next(iter(tops.values()))),
        "by": ranked_by(first),
        "seeds": list(tops),
        "tops": tops,
        "mean_overlap": float(pairs["overlap"].mean()),
        "min_overlap": float(pairs["overlap"].min()),
    }
    return pairs, summary


def stability_figure(pairs: pd.DataFrame, summary: dict, path: Path, title: str) -> Path:
    """The overlaps as a seed-by-seed grid (1 on the diagonal: a seed's top against itself)."""
    seeds = summary["seeds"]
    grid = np.eye(len(seeds))
    for row in pairs.itertuples():
        a, b = seeds.index(row.seed_a), seeds.index(row.seed_b)
        grid[a, b] = grid[b, a] = row.overlap
    labels = [str(s) for s in seeds]
    return heatmap(grid, path, title, labels, labels, "task seed", "task seed", f"overlap of the top {summary['n']}")

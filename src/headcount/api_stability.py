"""How stable a scan's top heads are across seeds of the task generator (`Run.seed_stability`): the scan run (by
Run, which strings its own methods together: nothing here calls back into it) on the task regenerated with each seed
(`seed_tasks`: task.seed = s, each in its own results folder `<task>_seed<s>`), each seed's top n
heads by damage (how much a head's removal worsens the metric: headcount's sign for every metric), and the overlap
|top_a & top_b| / n of every two seeds' tops, with their mean and lowest. Beside the bootstrap's stability over
resamples of one seed's prompts (ablation/scans/intervals.py), this is the other half of "the circuit is stable":
prompts drawn anew, not resampled.
"""

import dataclasses
from itertools import combinations

import pandas as pd

from headcount.ablation.engine.metrics import table_metric
from headcount.ablation.scans.intervals import top_n
from headcount.circuits.bootstrap import top_n_overlap
from headcount.config.task import TaskConfig
from headcount.errors import ConfigError
from headcount.tasks import task_name


def top_heads(table: pd.DataFrame, n: int) -> list[str]:
    """A head scan's n masks of largest damage, largest first (ties by the table's order)."""
    metric = table_metric(table)
    damage = metric.damage(table[f"delta_{metric.primary}"].astype(float), 0.0)
    return table.loc[damage.sort_values(ascending=False, kind="stable").index[:n], "mask"].astype(str).tolist()


def seed_tasks(base: TaskConfig | None, seeds: list[int]) -> list[TaskConfig]:
    """The task (Run's, or the one Run.seed_stability was given) regenerated with each seed, each in its own results
    folder; it must be a generator (a prompts file has no seed), and the seeds at least two different ones."""
    if base is None or base.source == "file":
        source = None if base is None else base.source
        raise ConfigError("task.source", source, "seed stability regenerates the task: a generator (ioi, ...)")
    if len(set(seeds)) < 2:
        raise ConfigError("seeds", list(seeds), "at least two different seeds of the task generator")
    return [dataclasses.replace(base, seed=seed, name=f"{task_name(base)}_seed{seed}") for seed in seeds]


def seed_stability(tables: dict[int, pd.DataFrame], n: int | None = None) -> tuple[pd.DataFrame, dict]:
    """(pairs, summary) of a head scan's tables by seed: a row per two seeds (seed_a, seed_b, overlap) and {n, seeds,
    tops (seed -> its top n), mean_overlap, min_overlap}. n: default 5% of the scan's masks (at least 1), as the
    scan's own stability."""
    tops = {seed: top_heads(table, n or top_n(len(table))) for seed, table in tables.items()}
    rows = [{"seed_a": a, "seed_b": b, "overlap": top_n_overlap(tops[a], tops[b])} for a, b in combinations(tops, 2)]
    pairs = pd.DataFrame(rows, columns=["seed_a", "seed_b", "overlap"])
    summary = {
        "n": len(next(iter(tops.values()))),
        "seeds": list(tops),
        "tops": tops,
        "mean_overlap": float(pairs["overlap"].mean()),
        "min_overlap": float(pairs["overlap"].min()),
    }
    return pairs, summary

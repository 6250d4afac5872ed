"""How stable a scan's top heads are across seeds of the task generator, from Python (`Run.seed_stability`): the
scan run by Run.scan on the task regenerated with each seed, compared as headcount-ablate's `ablation.task_seeds`
compares them (ablation/task_seeds.py says how).
"""

from typing import Any

import pandas as pd

from headcount.ablation import task_seeds
from headcount.ablation.task_seeds import top_heads  # noqa: F401  (what the Python API names a table's top heads by)


def seed_stability(
    run, kind: str, seeds: list[int], task: Any = None, n: int | None = None, **scan_args: Any
) -> tuple[pd.DataFrame, dict]:
    """(pairs, summary): a row per two seeds (seed_a, seed_b, overlap) and {n, seeds, tops (seed -> its top n),
    mean_overlap, min_overlap}. task: as for Run.scan (default: the run's); it must be a generator (a prompts file has
    no seed). n: default 5% of the scan's masks (at least 1), as the scan's own stability. scan_args: Run.scan's mode,
    metric and the kind's settings."""
    base = run.task_settings(task)
    task_seeds.check_generated(base, "task.source", None if base is None else base.source)
    seeds = task_seeds.check_task_seeds(seeds, "seeds")
    tables = {seed: run.scan(kind, task=task_seeds.seeded_task(base, seed), **scan_args) for seed in seeds}
    return task_seeds.seed_stability(tables, n)

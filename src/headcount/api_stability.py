"""How stable a scan's top heads are across seeds of the task generator, from Python (`Run.seed_stability`): Run runs
the scan on each seeded task (it strings its own methods together: nothing here calls back into it) and hands the
tables here, compared as headcount-ablate's `ablation.task_seeds` compares them (ablation/task_seeds.py says how).
"""

from headcount.ablation import task_seeds
from headcount.ablation.task_seeds import seed_stability, top_edges, top_heads  # noqa: F401  (the Python API's names)
from headcount.config.scans import EdgeAttributionSettings, ScanSettings
from headcount.config.task import TaskConfig


def seed_tasks(base: TaskConfig | None, seeds: list[int]) -> list[TaskConfig]:
    """The task (Run's, or the one Run.seed_stability was given) regenerated with each seed, each in its own results
    folder; it must be a generator (a prompts file has no seed), and the seeds at least two different ones."""
    task_seeds.check_generated(base, "task.source", None if base is None else base.source)
    return [task_seeds.seeded_task(base, seed) for seed in task_seeds.check_task_seeds(seeds, "seeds")]


def circuit_size(name: str, own: ScanSettings | None, scan_args: dict) -> int | None:
    """The n an edge_attribution scan's circuit is compared over across seeds: its circuit_size (scan_args', else the
    run config's for that scan, else the default); None for a head scan (its default n: 5% of the heads). own: the
    run config's settings of scan `name` (None: the scan is the kind of that name at its defaults)."""
    if (own.kind if own is not None else name) != "edge_attribution":
        return None
    default = getattr(own, "circuit_size", EdgeAttributionSettings.circuit_size)
    return int(scan_args.get("circuit_size", default))

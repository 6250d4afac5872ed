"""The runs of a sweep folder, found without reading them: what headcount-report checks before pandas, torch and the
result readers load (cli/report.py), and where the report (sweep_report.py) starts."""

from pathlib import Path

from headcount.errors import ConfigError


def find_runs(sweep_dir: Path) -> list[Path]:
    """Every run directory below sweep_dir: the folders Hydra saved a job's overrides in, less those inside another
    run (the logs of `headcount-ablate` on that run, under its ablation/ folder)."""
    found = sorted(p.parent.parent for p in sweep_dir.glob("**/.hydra/overrides.yaml"))
    return [run for run in found if not any(other in run.parents for other in found)]


def sweep_runs(sweep_dir: Path) -> list[Path]:
    """find_runs, or ConfigError naming sweep_dir when it holds none."""
    if not (run_dirs := find_runs(sweep_dir)):
        raise ConfigError("sweep_dir", str(sweep_dir), "holds no headcount runs (no */.hydra/overrides.yaml below it)")
    return run_dirs

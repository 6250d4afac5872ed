"""Published head-ablation findings, checked on the results of the experiments that reproduce them.

An experiment file names its finding (`finding: induction_heads`); after the run (or, for a sweep, after its last job)
the checker reads the results files, measures what the claims need, and writes <dir>/findings/: findings.json,
findings.md and figures. Each claim gets a plain verdict: reproduced, partly or not reproduced.
"""

from collections.abc import Callable
from importlib import import_module
from pathlib import Path

from headcount.errors import ConfigError
from headcount.findings.claims import Finding, write_finding

# finding -> (module, whether it reads one run directory or a sweep's folder)
CHECKERS = {
    "induction_heads": ("induction", "run"),
    "sixteen_heads": ("sixteen_heads", "run"),
    "voita_gates": ("voita_gates", "run"),
    "head_count": ("head_count", "sweep"),
    "concat_vs_sum": ("concat_vs_sum", "sweep"),
    "pretrained_heads": ("pretrained_heads", "run"),
}
# finding -> the scans whose results it reads (in each run): without them it cannot be checked
SCANS_READ = {
    "induction_heads": ("single_head", "head_scores"),
    "sixteen_heads": ("single_head", "leave_one_in", "pruning"),
    "voita_gates": ("l0_gates", "pruning", "importance"),
    "head_count": (),
    "concat_vs_sum": ("pruning",),
    "pretrained_heads": ("single_head", "pruning", "kv_groups"),
}


def validate_finding(name: str | None) -> None:
    if name is not None and name not in CHECKERS:
        raise ConfigError("finding", name, f"allowed: {', '.join(CHECKERS)} or null")


def missing_scans(name: str, scans: list[str]) -> list[str]:
    """The scans finding `name` reads that are not among `scans` (the names of a run's scans)."""
    return [scan for scan in SCANS_READ[name] if scan not in scans]


def reads_sweep(name: str) -> bool:
    return CHECKERS[name][1] == "sweep"


def check_finding(name: str, directory: Path) -> Path:
    """Check finding `name` on a run directory (or a sweep's folder); returns the findings.md written."""
    validate_finding(name)
    check: Callable[[Path, Path], Finding] = import_module(f"headcount.findings.{CHECKERS[name][0]}").check
    out = directory / "findings"
    out.mkdir(parents=True, exist_ok=True)
    return write_finding(check(directory, out), out)

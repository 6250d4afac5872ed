"""Published head-ablation findings, checked on the results of the experiments that reproduce them.

An experiment file names its finding (`finding: induction_heads`); after the run (or, for a sweep, after its last job)
the checker reads the results files, measures what the claims need, and writes <dir>/findings/: findings.json,
findings.md and figures. Each claim gets a plain verdict: reproduced, partly or not reproduced. Findings are
components (`FINDINGS`, findings/claims.py): each checker module registers its finding, with whether it reads one run
or a sweep and the scans it reads; importing this package imports them all.
"""

import pkgutil
from importlib import import_module
from pathlib import Path

from headcount.config.names import check_finding_name
from headcount.findings.claims import FINDINGS, write_finding

for _module in pkgutil.iter_modules(__path__):  # each checker module registers its finding
    import_module(f"{__name__}.{_module.name}")


def validate_finding(name: str | None) -> None:
    check_finding_name(name, FINDINGS.names())


def missing_scans(name: str, scans: list[str]) -> list[str]:
    """The scans finding `name` reads that are not among `scans` (the names of a run's scans)."""
    return [scan for scan in FINDINGS[name].scans if scan not in scans]


def reads_sweep(name: str) -> bool:
    return FINDINGS[name].reads == "sweep"


def check_finding(name: str, directory: Path) -> Path:
    """Check finding `name` on a run directory (or a sweep's folder); returns the findings.md written."""
    validate_finding(name)
    check = FINDINGS[name].check
    out = directory / "findings"
    out.mkdir(parents=True, exist_ok=True)
    return write_finding(check(directory, out), out)

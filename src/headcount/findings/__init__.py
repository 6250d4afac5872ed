"""Published head-ablation findings, checked on the results of the experiments that reproduce them.

An experiment file names its finding (`finding: induction_heads`); after the run (or, for a sweep, after its last job)
the checker reads the results files, measures what the claims need, and writes <dir>/findings/: findings.json,
findings.md and figures. Each claim gets a plain verdict: reproduced, partly or not reproduced. Findings are
components (`FINDINGS`): each is registered with its checker module, whether it reads one run or a sweep, and the
scans it reads.
"""

from collections.abc import Callable
from importlib import import_module
from pathlib import Path
from typing import NamedTuple

from headcount.errors import ConfigError
from headcount.findings.claims import Finding, write_finding
from headcount.registry import Registry


class FindingChecker(NamedTuple):
    module: str  # headcount.findings.<module>.check(directory, out) -> Finding
    reads: str  # "run": one run directory; "sweep": a sweep's folder
    scans: tuple[str, ...]  # the scans whose results it reads (in each run): without them it cannot be checked
    doc: str


FINDINGS: Registry[FindingChecker] = Registry("finding", "finding", "a published claim an experiment checks")
FINDINGS.add(
    "induction_heads",
    FindingChecker(
        "induction",
        "run",
        ("single_head", "head_scores"),
        "Olsson et al. 2022: induction heads carry in-context copying",
    ),
)
FINDINGS.add(
    "sixteen_heads",
    FindingChecker(
        "sixteen_heads", "run", ("single_head", "leave_one_in", "pruning"), "Michel et al. 2019: most heads can go"
    ),
)
FINDINGS.add(
    "voita_gates",
    FindingChecker(
        "voita_gates",
        "run",
        ("l0_gates", "pruning", "importance"),
        "Voita et al. 2019: L0 gates keep few heads at little cost",
    ),
)
FINDINGS.add(
    "head_count",
    FindingChecker("head_count", "sweep", (), "Vaswani et al. 2017; Michel et al. 2019: how many heads a layer needs"),
)
FINDINGS.add(
    "concat_vs_sum", FindingChecker("concat_vs_sum", "sweep", ("pruning",), "concatenated against summed heads")
)
FINDINGS.add(
    "pretrained_heads",
    FindingChecker(
        "pretrained_heads",
        "run",
        ("attribution", "importance", "pruning", "kv_groups"),
        "Michel et al. 2019; Olsson et al. 2022 on SmolLM2-135M",
    ),
)

FINDINGS.add(
    "ioi_heads",
    FindingChecker(
        "ioi_heads",
        "run",
        ("single_head", "attribution", "direct_effect", "position_attention", "top_heads"),
        "Wang et al. 2022: the heads that name the indirect object",
    ),
)
FINDINGS.add(
    "retrieval_heads",
    FindingChecker(
        "retrieval_heads", "run", ("retrieval_scores", "top_heads"), "Wu et al. 2024: retrieval heads copy from context"
    ),
)


def validate_finding(name: str | None) -> None:
    if name is not None and name not in FINDINGS:
        raise ConfigError("finding", name, f"{FINDINGS.allowed(name)} (or null)")


def missing_scans(name: str, scans: list[str]) -> list[str]:
    """The scans finding `name` reads that are not among `scans` (the names of a run's scans)."""
    return [scan for scan in FINDINGS[name].scans if scan not in scans]


def reads_sweep(name: str) -> bool:
    return FINDINGS[name].reads == "sweep"


def check_finding(name: str, directory: Path) -> Path:
    """Check finding `name` on a run directory (or a sweep's folder); returns the findings.md written."""
    validate_finding(name)
    check: Callable[[Path, Path], Finding] = import_module(f"headcount.findings.{FINDINGS[name].module}").check
    out = directory / "findings"
    out.mkdir(parents=True, exist_ok=True)
    return write_finding(check(directory, out), out)

"""A finding as a list of claims, each a paper's sentence beside what we measured and a plain verdict; written as
findings.json (numbers for tests and tables) and findings.md (for people), and printed as a table."""

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from headcount.io import atomic_write_json, atomic_write_text
from headcount.registry import Registry

VERDICTS = ("reproduced", "partly", "not reproduced")


@dataclass
class Claim:
    claim: str  # the paper's claim, as our experiment tests it
    measured: str  # what we found, with the numbers
    verdict: str  # one of VERDICTS


@dataclass
class Finding:
    experiment: str
    paper: str
    claims: list[Claim]
    numbers: dict  # every number the verdicts rest on, by name
    figures: list[Path] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        verdicts = {claim.verdict for claim in self.claims}
        return verdicts.pop() if len(verdicts) == 1 else "partly"


class FindingChecker(NamedTuple):
    """A finding as a component, registered by its checker module: `FINDINGS.register(FindingChecker(...))`."""

    name: str  # what an experiment's `finding:` names
    check: Callable[[Path, Path], Finding]  # (run or sweep directory, out folder) -> the finding
    reads: str  # "run": one run directory; "sweep": a sweep's folder
    scans: tuple[str, ...]  # the scans whose results it reads (in each run): without them it cannot be checked
    doc: str


FINDINGS: Registry[FindingChecker] = Registry("finding", "finding", "a published claim an experiment checks")


def verdict(holds: bool, partly: bool = False) -> str:
    return "reproduced" if holds else "partly" if partly else "not reproduced"


def write_finding(finding: Finding, out: Path) -> Path:
    """out/findings.json and out/findings.md; prints the verdicts. Returns the markdown path."""
    out.mkdir(parents=True, exist_ok=True)
    figures = [str(path.relative_to(out)) for path in finding.figures]
    record = {**asdict(finding), "figures": figures, "verdict": finding.verdict}
    atomic_write_json(out / "findings.json", record)
    lines = [
        f"# {finding.experiment}: {finding.verdict}",
        "",
        f"Paper: {finding.paper}",
        "",
        "| claim | measured | verdict |",
        "| --- | --- | --- |",
        *(f"| {c.claim} | {c.measured} | **{c.verdict}** |" for c in finding.claims),
        "",
        *(f"![{name}]({name})" for name in figures),
    ]
    atomic_write_text(out / "findings.md", "\n".join(lines) + "\n")
    table = Table(title=f"{finding.experiment} ({finding.paper}): {finding.verdict}", show_lines=True)
    for column in ("claim", "measured", "verdict"):
        table.add_column(column)
    for c in finding.claims:
        table.add_row(escape(c.claim), escape(c.measured), c.verdict)
    Console(stderr=True).print(table)
    return out / "findings.md"

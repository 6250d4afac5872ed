"""Scan kinds, one module each in this package, found when the package is imported: every module's `Scan` subclass
decorated with `@KINDS.register` becomes the kind it names. Adding a kind is one module here and its
conf/ablation/<kind>.yaml.

Mask scans (mask_scan.py) switch heads off by named masks and evaluate each exactly: `baseline` (nothing off),
`single_head` (each head off alone), `layer` (every head of one layer off), `leave_one_in` (in one layer only one head
on), `pairs` (two heads off together: all pairs, or pairs among the `top_k` heads with the largest single-head loss
increase), `kv_groups` (each key/value head with all the query heads that share it) and `custom` (masks from a file,
see masks.py). The others: `importance` (gradient importance), `pruning`
(masked pruning curves), `l0_gates` (learned head gates) and `head_scores` (attention-pattern scores).
"""

import pkgutil
import re
from importlib import import_module

from headcount.ablation.scans.base import KINDS, Scan
from headcount.config.ablation import AblationConfig
from headcount.errors import ConfigError

__all__ = ["KINDS", "Scan", "validate_scans"]

SCAN_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")  # scan names become file names

for _module in pkgutil.iter_modules(__path__):
    import_module(f"{__name__}.{_module.name}")


def validate_scans(settings: AblationConfig) -> None:
    """The checks on the listed scans that need no model: a usable name, a known kind, and each kind's own."""
    for name, scan in settings.scans.items():
        if not SCAN_NAME.match(name):
            raise ConfigError(f"ablation.scans.{name}", name, "scan names may use letters, digits, '_', '.' and '-'")
        KINDS.get(scan.kind, f"ablation.scans.{name}.kind").check(name, scan, settings)

"""Scan kinds, one module each in this package, found when the package is imported: every module's `Scan` subclass
decorated with `@KINDS.register` becomes the kind it names, and its `Settings` (config/scans.py: composed before torch
loads) the schema Hydra types the kind's config entries by. Adding a kind is one module here, its settings class in
config/scans.py if it takes keys, and its conf/ablation/<kind>.yaml.
`headcount-ablate --list` lists the kinds, each with its line.

Mask scans (a `MaskScan`, mask_scan.py) switch heads off by named masks and evaluate each exactly; the others compute
their tables their own way (gradients, learned gates, attention patterns, direct effects).
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

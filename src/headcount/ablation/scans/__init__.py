"""Scan kinds, one module each in this package, found when the package is imported: every module's `Scan` subclass
decorated with `@KINDS.register` becomes the kind it names, and its `Settings` the schema Hydra types the kind's
config entries by (`scan_settings/<kind>`, which conf/ablation/<kind>.yaml names first in its defaults list: a key the
kind does not take is refused at compose time). Adding a kind is one module here and its conf/ablation/<kind>.yaml.
`headcount-ablate --list` lists the kinds, each with its line.

Mask scans (a `MaskScan`, mask_scan.py) switch heads off by named masks and evaluate each exactly; the others compute
their tables their own way (gradients, learned gates, attention patterns, direct effects).
"""

import pkgutil
import re
from importlib import import_module

from hydra.core.config_store import ConfigStore

from headcount.ablation.scans.base import KINDS, Scan
from headcount.config.ablation import AblationConfig
from headcount.errors import ConfigError

__all__ = ["KINDS", "Scan", "validate_scans"]

SCAN_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")  # scan names become file names

SETTINGS_GROUP = "scan_settings"  # the ConfigStore group of the kinds' settings schemas

for _module in pkgutil.iter_modules(__path__):
    import_module(f"{__name__}.{_module.name}")


def register_settings_schemas() -> None:
    """Each kind's Settings as `scan_settings/<kind>` in Hydra's ConfigStore, for conf/ablation/<kind>.yaml."""
    store = ConfigStore.instance()
    for kind in KINDS:
        store.store(group=SETTINGS_GROUP, name=kind, node=KINDS[kind].Settings(kind=kind))


register_settings_schemas()


def validate_scans(settings: AblationConfig) -> None:
    """The checks on the listed scans that need no model: a usable name, a known kind, and each kind's own."""
    for name, scan in settings.scans.items():
        if not SCAN_NAME.match(name):
            raise ConfigError(f"ablation.scans.{name}", name, "scan names may use letters, digits, '_', '.' and '-'")
        KINDS.get(scan.kind, f"ablation.scans.{name}.kind").check(name, scan, settings)

"""The component names a composed config uses, checked against the registries' index (registry.py) before torch and
the modules that define the components are imported: a misspelt mode, metric, scan kind, task source or finding is
the registry's own one line, at once (the commands run this first: cli/sweep.py's ValidateJobsFirst, headcount-ablate).
The full checks (config/ and the layers above) come after and repeat these; an index that disagrees with the
registries fails tests/test_components.py."""

from omegaconf import DictConfig

from headcount.errors import ConfigError
from headcount.registry import IndexedKind, allowed, indexed_kinds


def check_task_source(source: str, sources: list[str]) -> None:
    if source not in sources:
        raise ConfigError("task.source", source, f"{allowed(sorted(sources), source)} (or ~task: none)")


def check_finding_name(name: str | None, findings: list[str]) -> None:
    if name is not None and name not in findings:
        raise ConfigError("finding", name, f"{allowed(findings, name)} (or null)")


def check_component_names(cfg: DictConfig, kinds: dict[str, IndexedKind] | None = None) -> None:
    """ConfigError for the first name in cfg (a train or ablate config) that no component of its kind has; kinds:
    the index (default: the package's)."""
    kinds = indexed_kinds() if kinds is None else kinds
    ablation = cfg.get("ablation")
    if ablation is not None:
        kinds["ablation mode"].check(str(ablation.mode))
        if isinstance(metric := ablation.get("metric"), str):  # else a user's function (`_target_`) or the default
            kinds["metric"].check(metric)
        for name, scan in (ablation.get("scans") or {}).items():
            if scan.get("kind") is not None:  # none: settings for a scan the list left out (unselected_scans_dropped)
                kinds["scan kind"].check(str(scan.kind), f"ablation.scans.{name}.kind")
    task = cfg.get("task")
    if task is not None and task.get("source") is not None:
        check_task_source(str(task.source), kinds["task source"].names())
    check_finding_name(cfg.get("finding"), kinds["finding"].names())

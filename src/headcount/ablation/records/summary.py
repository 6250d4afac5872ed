"""summary.json: the headline numbers of <run>/ablation/, one section per ablation mode, so that every mode's
results coexist and nothing a command recorded vanishes when another runs.

    {"format": 2,
     "modes": {"zero": {"fingerprint", "model", "data", "settings", "baseline_loss", "baseline_acc", "n_targets",
                        "scans": {name: {"kind", "fingerprint", "files", "rows", "seconds"}},
                        "most_important_head", "prunable_fraction", "arbitrary_orders", "l0_gates", "pruned"},
               "mean": {...}},
     "mode_independent": {"scans": {...}},      scans whose result no mode changes (head_scores)
     "superseded": [{"mode", "reason", ...}]}   sections replaced because the settings, the model or the data changed

A mode's section is bound to the fingerprint of what every result in it depends on (the model's weights, the data's
content, the settings); when that changes, the old section moves to `superseded`, with the reason, rather than mixing
numbers from two setups. Readers (reports, W&B, findings) go through `mode_summary`, which also reads the flat layout
that runs written before modes coexisted hold. Every write is atomic.
"""

import json
from pathlib import Path

from headcount.io import atomic_write_json

FORMAT = 2
SHARED = "mode_independent"


def read_summary(path: Path) -> dict:
    """summary.json in the current layout (a flat one becomes the section of the mode it records); {} if absent."""
    if not path.exists():
        return {"format": FORMAT, "modes": {}}
    summary = json.loads(path.read_text())
    if "modes" in summary:
        return summary
    return {"format": FORMAT, "modes": {summary.get("mode", "zero"): {**summary, "layout": 1}}}


def mode_summary(summary: dict, mode: str = "zero") -> dict:
    """One mode's section of a summary.json's contents, in either layout; {} when that mode has none."""
    if "modes" in summary:
        return summary["modes"].get(mode, {})
    return summary if summary.get("mode", "zero") == mode else {}


def summary_in(folder: Path) -> Path:
    """The summary.json of a results folder (an address's folder: its summary_path): the one place its name is
    written."""
    return Path(folder) / "summary.json"


def summary_beside(path: Path) -> Path:
    """The summary.json of the results folder that holds `path` (a result's file): what records it."""
    return summary_in(Path(path).parent)


def read_mode_summary(folder: Path, mode: str = "zero") -> dict:
    """The section of `mode` in the summary.json of a results folder (an address's folder); {} when there is none."""
    path = summary_in(folder)
    return mode_summary(json.loads(path.read_text()), mode) if path.exists() else {}


def write_if_changed(path: Path, summary: dict) -> bool:
    """Write summary.json unless it holds this already (a rerun with every result up to date writes nothing, so it
    also works on a run directory on read-only storage); returns whether it wrote."""
    if path.exists() and json.loads(path.read_text()) == summary:
        return False
    atomic_write_json(path, summary)
    return True


def open_mode(path: Path, mode: str, header: dict) -> tuple[str | None, bool]:
    """Start (or continue) a session's section: header holds its fingerprint, model, data and settings, and the
    headline numbers every session recomputes. A section recorded under another fingerprint moves to `superseded`;
    returns why (or None), and whether summary.json changed."""
    summary = read_summary(path)
    section = summary["modes"].get(mode)
    reason = None
    if section is not None and section.get("fingerprint") != header["fingerprint"]:
        reason = why_superseded(section, header)
        summary.setdefault("superseded", []).append({"mode": mode, "reason": reason, **section})
        section = None
    summary["modes"][mode] = {**(section or {}), **header}
    return reason, write_if_changed(path, summary)


def why_superseded(old: dict, new: dict) -> str:
    """Which of the inputs changed, in words: the settings (with the values), the model, the data."""
    if old.get("layout") == 1:
        return "recorded by an older headcount, before results carried content fingerprints"
    reasons = []
    old_settings, new_settings = old.get("settings", {}), new["settings"]
    changed = [k for k in sorted(set(old_settings) | set(new_settings)) if old_settings.get(k) != new_settings.get(k)]
    if changed:
        values = ", ".join(f"{k}: {old_settings.get(k)} -> {new_settings.get(k)}" for k in changed)
        reasons.append(f"settings changed ({values})")
    if old.get("model") != new["model"]:
        reasons.append("the model's weights changed")
    if old.get("data") != new["data"]:
        reasons.append("the data changed")
    return "; ".join(reasons) or "the results' fingerprint changed"


def update_section(path: Path, mode: str | None, updates: dict) -> bool:
    """Merge `updates` into a mode's section (mode None: the mode-independent one), one level deep for dict values;
    returns whether summary.json changed."""
    summary = read_summary(path)
    section = summary["modes"].setdefault(mode, {}) if mode is not None else summary.setdefault(SHARED, {})
    for name, value in updates.items():
        if isinstance(value, dict) and isinstance(section.get(name), dict):
            section[name] = {**section[name], **value}
        else:
            section[name] = value
    return write_if_changed(path, summary)


def scan_entry(path: Path, mode: str | None, name: str) -> dict:
    """What summary.json records about scan `name` in a mode's section (None: the mode-independent one)."""
    summary = read_summary(path)
    section = summary["modes"].get(mode, {}) if mode is not None else summary.get(SHARED, {})
    return section.get("scans", {}).get(name, {})


def record_default_metric(path: Path, metric: str) -> None:
    """The metric a task's results use when the config names none (its summary.json's `default_metric`), so readers
    of a run's config find the section it asks for."""
    summary = read_summary(path)
    if summary.get("default_metric") != metric:
        atomic_write_json(path, {**summary, "default_metric": metric})


def record_task_source(path: Path, source: dict[str, str]) -> None:
    """Where a task folder's prompts come from and a hash of them (its summary.json's `task_source`): two prompt files
    of one stem in different folders shared tasks/<stem>/, the second's results replacing the first's."""
    summary = read_summary(path)
    if summary.get("task_source") != source:
        atomic_write_json(path, {**summary, "task_source": source})


def record_scan(path: Path, mode: str | None, name: str, entry: dict) -> None:
    """A scan's entry in a mode's section (None: the mode-independent one); an entry it replaces that was computed
    under another fingerprint (other masks, settings) moves to `superseded`, so its record does not vanish."""
    summary = read_summary(path)
    section = summary["modes"].setdefault(mode, {}) if mode is not None else summary.setdefault(SHARED, {})
    old = section.setdefault("scans", {}).get(name)
    if old is not None and old.get("fingerprint") != entry["fingerprint"]:
        reason = f"scan {name} computed again under other settings (its masks or its own settings changed)"
        summary.setdefault("superseded", []).append({"mode": mode, "scan": name, "reason": reason, **old})
    section["scans"][name] = entry
    write_if_changed(path, summary)


def rename_scan(path: Path, mode: str | None, old: str, new: str, entry: dict) -> None:
    """Move a scan's record from entry `old` to entry `new` (as `entry`) in a mode's section (None: the
    mode-independent one): a result that was recorded under another name, unchanged."""
    summary = read_summary(path)
    section = summary["modes"].setdefault(mode, {}) if mode is not None else summary.setdefault(SHARED, {})
    scans = section.setdefault("scans", {})
    scans.pop(old, None)
    scans[new] = entry
    write_if_changed(path, summary)


def entry_of_file(path: Path, file_name: str) -> dict | None:
    """The scan entry (of any section) that records file_name among its files; None when none records it."""
    summary = read_summary(path)
    sections = [*summary["modes"].values(), summary.get(SHARED, {})]
    for section in sections:
        for entry in section.get("scans", {}).values():
            if file_name in entry.get("files", []):
                return entry
    return None

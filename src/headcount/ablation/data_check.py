"""The data an ablation sees, checked against the data its run trained on.

Training records each split's content fingerprint in the run directory (run_dir.record_data_fingerprint). A session
rebuilds the splits from the run's config and compares: a text file edited since training, a changed cache or a
changed generator would otherwise change every later number without a word. A change stops the session, naming the
splits that changed, unless `ablation.allow_data_change=true`; then the results are computed on the data as it is
now, and summary.json records that they were.
"""

from pathlib import Path

from rich.console import Console
from rich.markup import escape

from headcount.data.fingerprint import changed_splits, data_fingerprint
from headcount.errors import ConfigError
from headcount.run_dir import FinishedRun, read_data_fingerprint


def checked_data(run_dir: Path, run: FinishedRun, allow_change: bool) -> dict:
    """What summary.json records about the data: its fingerprint now, and how it compares with the data trained on.
    ConfigError naming ablation.allow_data_change when the data changed and that is not allowed."""
    current = data_fingerprint(run.splits)
    trained_on = read_data_fingerprint(run_dir)
    if trained_on is None:
        Console(stderr=True).print(
            f"[yellow]note:[/yellow] {escape(str(run_dir))} recorded no data fingerprint at training time (trained by "
            "an older headcount): the data cannot be checked against the data it trained on",
            highlight=False,
            soft_wrap=True,
        )
        return {"fingerprint": current, "checked_against_training": False}
    changed = changed_splits(trained_on, current)
    if changed and not allow_change:
        raise ConfigError(
            "ablation.allow_data_change",
            False,
            f"the data changed since this run trained on it ({describe_change(trained_on, current, changed)}, "
            f"from data.source={run.config.data.source}"
            + (f" data.path={run.config.data.path}" if run.config.data.get("path") else "")
            + "); set ablation.allow_data_change=true to ablate on the data as it is now",
        )
    record = {"fingerprint": current, "checked_against_training": True}
    return record | ({"changed_since_training": changed, "allow_data_change": True} if changed else {})


def describe_change(old: dict, new: dict, splits: list[str]) -> str:
    """e.g. "split val: 24 -> 30 examples, split test: same size, other tokens"."""

    def one(split: str) -> str:
        before, after = old.get(split, {}).get("examples"), new.get(split, {}).get("examples")
        if before == after:
            return f"split {split}: same size, other tokens"
        return f"split {split}: {before} -> {after} examples"

    return ", ".join(one(split) for split in splits)

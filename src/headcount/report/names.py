"""How a sweep names its runs: folders named by the swept keys (`n_heads=4,seed=1`), and the short column labels of
the report's table.

A key is shown by its last segments, as few as tell it apart from the other keys shown with it (`model.attn.n_heads`
-> `n_heads`; `model.dropout` and `trainer.dropout` keep two). A value is kept as typed when it uses only letters,
digits and `. _ + -`; a list becomes its items joined by `+` (`ablation=baseline+pruning`); anything else (spaces,
slashes, quotes, brackets) becomes `_` with a short hash of the value appended, so names stay distinct. Folder names
are therefore safe to type in a shell unquoted and stable: the same overrides always give the same name.
"""

import hashlib
import re
from collections.abc import Iterable, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override

SAFE_VALUE = re.compile(r"[A-Za-z0-9._+-]+")
UNSAFE_RUN = re.compile(r"[^A-Za-z0-9._+-]+")
EMPTY_LIST = "empty"


def short_labels(keys: Iterable[str]) -> dict[str, str]:
    """key -> its last segments, as few as no other key ends with (`model.attn.n_heads` -> `n_heads`)."""
    keys = list(dict.fromkeys(keys))
    split = {key: re.split(r"[./]", key) for key in keys}

    def ends_with(key: str, tail: list[str]) -> bool:
        return split[key][-len(tail) :] == tail

    labels = {}
    for key, parts in split.items():
        n = 1
        while n < len(parts) and any(ends_with(other, parts[-n:]) for other in keys if other != key):
            n += 1
        labels[key] = ".".join(parts[-n:])
    return labels


def safe_value(text: str) -> str:
    """A value as a folder-name part: as typed when safe, else cleaned up and made distinct by a short hash."""
    if SAFE_VALUE.fullmatch(text):
        return text
    cleaned = UNSAFE_RUN.sub("_", text).strip("_") or "value"
    return f"{cleaned}-{hashlib.sha1(text.encode()).hexdigest()[:6]}"


def value_text(override: Override) -> str:
    if override.is_delete():
        return "deleted"
    value = override.value()
    if isinstance(value, list):
        return "+".join(safe_value(str(item)) for item in value) if value else EMPTY_LIST
    return safe_value(override.get_value_element_as_str())


def parse(overrides: Sequence[str]) -> list[Override]:
    return OverridesParser.create().parse_overrides(list(overrides))


def override_values(overrides: Sequence[str], exclude: Iterable[str] = ()) -> dict[str, str]:
    """key -> value as it names folders, for the overrides whose key is not excluded."""
    excluded = set(exclude)
    return {o.key_or_group: value_text(o) for o in parse(overrides) if o.key_or_group not in excluded}


def folder_name(overrides: Sequence[str], exclude: Iterable[str] = ()) -> str:
    """`label=value,...` over the overrides whose key is not excluded, sorted by key; `run` when none is left."""
    values = override_values(overrides, exclude)
    labels = short_labels(sorted(values))
    return ",".join(f"{labels[key]}={values[key]}" for key in sorted(values)) or "run"

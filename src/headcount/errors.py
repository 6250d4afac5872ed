"""One exception type for bad input, so entry points can print it as one line and exit non-zero."""

import difflib
import math
from collections.abc import Iterable
from enum import Enum
from typing import Any


class ConfigError(ValueError):
    """Bad user input: names the config key, the bad value and what is allowed."""

    def __init__(self, key: str, value: Any, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        shown = value.value if isinstance(value, Enum) else value  # a config choice reads as its plain value
        super().__init__(f"{key}={shown!r}: {allowed}")


SEED_MAX = 2**32 - 1  # numpy's (and Lightning's seed_everything's) range: outside it a random seed is drawn instead


def check_seed(key: str, seed: object) -> None:
    """ConfigError for a seed numpy cannot take (Lightning would warn and train under a random seed instead)."""
    if not (isinstance(seed, int) and 0 <= seed <= SEED_MAX):
        raise ConfigError(key, seed, f"must be an integer in 0..{SEED_MAX} (numpy's range)")


def finite(value: object) -> bool:
    """A real number that is neither infinite nor NaN (`inf` and `nan` pass `> 0` or fail no `< 0` check: a cap, a
    scale or a rate of either makes every number after it NaN)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_positive(key: str, value: object, allowed: str = "must be a finite number above 0") -> None:
    """ConfigError unless value is a finite number above 0."""
    if not (finite(value) and value > 0):
        raise ConfigError(key, value, allowed)


def check_non_negative(key: str, value: object, allowed: str = "must be a finite number, 0 or more") -> None:
    """ConfigError unless value is a finite number of 0 or more."""
    if not (finite(value) and value >= 0):
        raise ConfigError(key, value, allowed)


def closest(word: str, options: Iterable[str]) -> str | None:
    """The option most like word (a misspelling's intended value), if any is close."""
    matches = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return matches[0] if matches else None


def unknown_key(full_key: str, value: Any, keys: Iterable[str]) -> ConfigError:
    """`trainer.max_step=10: not a key of trainer (its keys: ...); did you mean trainer.max_steps?`"""
    keys = list(keys)
    parent, _, name = full_key.rpartition(".")
    where = f"of {parent}" if parent else "of the config"
    allowed = f"not a key {where} (its keys: {', '.join(keys)})"
    if (match := closest(name, keys)) is not None:
        allowed += f"; did you mean {parent + '.' if parent else ''}{match}?"
    return ConfigError(full_key, value, allowed)

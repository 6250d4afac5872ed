"""One exception type for bad input, so entry points can print it as one line and exit non-zero."""

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

"""One exception type for bad input, so entry points can print it as one line and exit non-zero."""

from enum import Enum
from typing import Any


class ConfigError(ValueError):
    """Bad user input: names the config key, the bad value and what is allowed."""

    def __init__(self, key: str, value: Any, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        shown = value.value if isinstance(value, Enum) else value  # a config choice reads as its plain value
        super().__init__(f"{key}={shown!r}: {allowed}")

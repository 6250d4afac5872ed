"""One exception type for bad input, so entry points can print it as one line and exit non-zero."""

from typing import Any


class ConfigError(ValueError):
    """Bad user input: names the config key, the bad value and what is allowed."""

    def __init__(self, key: str, value: Any, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key}={value!r}: {allowed}")

"""Config values from a fixed set, checked when Hydra composes the config rather than deep inside a run.

A field typed with a `Choice` makes OmegaConf refuse any other value at compose time, naming the allowed ones. Being a
str, a choice compares, hashes, formats and serialises as its plain value (`Combine.sum == "sum"`), so code and result
files see ordinary strings. Configs built in Python skip composition, so each section's validate function still checks
its choices with `check_choice`.
"""

from dataclasses import fields
from enum import Enum
from typing import Any

from headcount.errors import ConfigError


class Choice(str, Enum):
    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


def choices(name: str, values: list[str]) -> type[Choice]:
    """A Choice whose members are named by their values, for values that are not identifiers (`32-true`): OmegaConf
    looks members up by name."""
    return Choice(name, [(value, value) for value in values], module=__name__)


def allowed(kind: type[Choice]) -> str:
    return "allowed: " + ", ".join(member.value for member in kind)


def check_choice(key: str, value: Any, kind: type[Choice]) -> None:
    if value not in {member.value for member in kind}:
        raise ConfigError(key, value, allowed(kind))


def check_bools(key: str, section: Any) -> None:
    """ConfigError for a field of a config dataclass typed bool (or bool | None) that holds anything but true or
    false (or null): a config built in Python is not typed by OmegaConf, which would also have read 2 as true."""
    for field in fields(section):
        if field.type not in (bool, bool | None):
            continue
        value, nullable = getattr(section, field.name), field.type is not bool
        if not (isinstance(value, bool) or (nullable and value is None)):
            raise ConfigError(f"{key}.{field.name}", value, "must be true or false" + (" or null" if nullable else ""))

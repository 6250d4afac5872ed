"""How every command reports bad input: one line on stderr and exit code 2 (a diverged run: exit 1), not a traceback.

Bad input is our ConfigError, or a value OmegaConf or Hydra refused while composing the config (a misspelt key, a
wrong type, a value outside a choice). Hydra prints its own composition errors over several lines and exits 1 unless
HYDRA_FULL_ERROR is set, in which case it raises them: the commands set it and print the error here instead.
"""

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException, ValidationError
from rich.console import Console

from headcount.errors import ConfigError
from headcount.train.module import NonFiniteLossError

BAD_INPUT = (ConfigError, HydraException, OmegaConfBaseException)


def as_config_error(error: BaseException) -> ConfigError | None:
    """A value OmegaConf refused (wrong type, outside a choice) as a ConfigError naming its key; None for others."""
    cause = error.__cause__ if isinstance(error, HydraException) and error.__cause__ is not None else error
    if isinstance(error, ConfigError) or not (isinstance(cause, ValidationError) and cause.full_key):
        return error if isinstance(error, ConfigError) else None
    reason = cause.msg.splitlines()[0]
    if "expected one of [" in reason:
        reason = "allowed: " + reason.split("expected one of [", 1)[1].rstrip("]")
    return ConfigError(cause.full_key, cause.value, reason)


def describe(error: BaseException) -> str:
    """One line for a bad-input error: `key=value: what is allowed` where the error names a key and a value, else the
    error's first line and its cause's (Hydra wraps OmegaConf's error, with hints that do not apply to typed
    configs)."""
    if (config_error := as_config_error(error)) is not None:
        return str(config_error)
    parts = [error] if error.__cause__ is None else [error, error.__cause__]
    return " ".join(str(e).strip().splitlines()[0] for e in parts if str(e).strip())


def print_error(message: str) -> None:
    Console(stderr=True).print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True, markup=False)


def exit_on_config_error(fn: Callable) -> Callable:
    """Bad input becomes one line on stderr and exit code 2 (a diverged run: exit 1), not a traceback."""

    @functools.wraps(fn)  # Hydra names the job (and its log file) after the task function
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BAD_INPUT as e:
            print_error(describe(e))
            sys.exit(2)
        except NonFiniteLossError as e:
            print_error(str(e))
            sys.exit(1)

    return wrapped


def run_hydra_command(hydra_main: Callable[[], Any]) -> None:
    """Run a @hydra.main function so that composition errors, too, come out as one line and exit code 2."""
    os.environ["HYDRA_FULL_ERROR"] = "1"
    exit_on_config_error(hydra_main)()

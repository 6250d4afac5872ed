"""How every command reports bad input: one line on stderr and exit code 2 (a diverged run: exit 1), not a traceback."""

import sys

from rich.console import Console

from headcount.errors import ConfigError
from headcount.train.module import NonFiniteLossError


def exit_on_config_error(fn):
    """Bad input becomes one line on stderr and exit code 2 (a diverged run: exit 1), not a traceback."""

    def wrapped(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ConfigError, NonFiniteLossError) as e:
            Console(stderr=True).print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
            sys.exit(2 if isinstance(e, ConfigError) else 1)

    return wrapped

"""How every command reports bad input: one line on stderr, `error: <key>=<value>: <what is allowed>[; did you mean
X?]`, and exit code 2 (a diverged run: exit 1), not a traceback; and leaves nothing behind that looks like a run.

Bad input is our ConfigError, or what Hydra or OmegaConf refused while composing the config: a misspelt key, an option
a config group lacks, a wrong type, a value outside a choice. Hydra prints its own composition errors over several
lines (and, for an unknown option, the whole search path) unless HYDRA_FULL_ERROR is set, in which case it raises
them: the commands set it and turn them into the one line here, with the closest key or option when there is one.
"""

import functools
import logging
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError
from rich.console import Console
from rich.text import Text

from headcount import processes, run_lock
from headcount.config import CONF_DIR
from headcount.config.scans import not_taken
from headcount.errors import ConfigError, closest, unknown_key
from headcount.io import READ_ONLY_ERRNOS, write_fault
from headcount.registry import indexed_kinds
from headcount.train import peers

BAD_INPUT = (ConfigError, HydraException, OmegaConfBaseException)
HYDRA_FILES = (".hydra", run_lock.LOCK_NAME)  # besides Hydra's log files (*.log): what a run folder holds at first


def group_options(group: str) -> list[str]:
    """The options of a config group, as Hydra finds them (our conf/ and any --config-dir), schemas aside."""
    if GlobalHydra.instance().is_initialized():
        options = GlobalHydra.instance().config_loader().get_group_options(group)
    else:
        options = sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))
    return [option for option in options if not option.endswith("_schema")]


def unknown_option(error: MissingConfigException) -> ConfigError:
    """`model=tinyy: allowed: attn_only_2l, ..., tiny; did you mean tiny?`"""
    group, _, option = (error.missing_cfg_file or "").rpartition("/")
    options = error.options or group_options(group)
    allowed = f"allowed: {', '.join(options)}" if options else f"{group} has no option {option}"
    if (match := closest(option, options)) is not None:
        allowed += f"; did you mean {match}?"
    return ConfigError(group, option, allowed)


def typed_value(override: str) -> Any:
    """An override's value as Hydra parses it (`4` -> 4), for the message; the text itself if it does not parse."""
    try:
        return OverridesParser.create().parse_override(override).value()
    except OverrideParseException:
        return override.partition("=")[2]


def unknown_override(error: HydraException, cause: ConfigKeyError | ConfigAttributeError) -> ConfigError:
    """A command-line key the config lacks. Hydra's message ends with the override (`use +model.attn.n_head=4`)."""
    override = str(error).rsplit(" use +", 1)[-1].strip() if " use +" in str(error) else ""
    value = typed_value(override) if override else None
    if cause.full_key.startswith("ablation.scans.") and cause.full_key.count(".") == 2:
        scan = cause.full_key.rsplit(".", 1)[1]
        selected = list(cause.parent_node.keys()) if cause.parent_node is not None else []
        return ConfigError(
            override.partition("=")[0] or cause.full_key,
            value,
            f"no scan named {scan} is selected (selected: {', '.join(selected) or 'none'}); "
            f"select it first, e.g. ablation=[{','.join([*selected, scan])}]",
        )
    parts = cause.full_key.split(".")
    kind = cause.parent_node.get("kind") if isinstance(cause.parent_node, DictConfig) else None
    if (
        cause.full_key.startswith("ablation.scans.")
        and len(parts) == 4
        and kind in indexed_kinds()["scan kind"].names()
    ):
        return not_taken(parts[2], kind, parts[3], value)  # a setting the scan's kind does not take
    if cause.full_key.startswith("model.cross_attn.") and cause.full_key.count(".") == 2:
        # null (model.attn's settings) or a model config's partial mapping: Hydra adds a key there only when told to
        key = cause.full_key.rsplit(".", 1)[1]
        allowed = f"model.cross_attn does not set {key} here (it takes model.attn's settings); add it with ++"
        return ConfigError(cause.full_key, value, f"{allowed}: ++{cause.full_key}={override.partition('=')[2]}")
    keys = list(cause.parent_node.keys()) if cause.parent_node is not None else []
    return unknown_key(cause.full_key, value, [key for key in keys if key != "hydra"])  # Hydra's node: not ours


def unreadable_override(error: OverrideParseException) -> ConfigError | None:
    """A value Hydra's lexer or grammar refuses unquoted (non-ASCII letters, parentheses, ...: paths often have them),
    with the fix: quote it, past the shell. None for other parse errors (an unknown sweep function, ...)."""
    key, sep, value = error.override.partition("=")
    if not sep or error.message.startswith("Error parsing override"):
        return None
    quoted = value.replace("\\", "\\\\").replace('"', '\\"')
    return ConfigError(
        key.lstrip("+~"),
        value,
        f"Hydra cannot read this value unquoted; quote it, with the quotes passed through the shell: "
        f"'{key}=\"{quoted}\"'",
    )


def group_set_to_null(error: BaseException) -> ConfigError | None:
    """`task=null` on the command line: Hydra raises a bare ValueError naming neither the group nor the fix."""
    if not (isinstance(error, ValueError) and "Config group override must be a string or a list" in str(error)):
        return None
    nulls = [
        arg.partition("=")[0] for arg in sys.argv[1:] if "." not in arg.partition("=")[0] and arg.endswith("=null")
    ]
    group = nulls[-1].lstrip("+") if nulls else "a config group"
    return ConfigError(group, None, f"a config group takes an option's name; for none, write ~{group}")


def as_config_error(error: BaseException) -> ConfigError | None:
    """Bad input Hydra or OmegaConf refused, as a ConfigError naming its key; None for errors without a key."""
    if isinstance(error, ConfigError):
        return error
    if (null_group := group_set_to_null(error)) is not None:
        return null_group
    if isinstance(error, OverrideParseException) and (unreadable := unreadable_override(error)) is not None:
        return unreadable
    if isinstance(error, MissingConfigException) and error.missing_cfg_file:
        return unknown_option(error)
    cause = error.__cause__ if isinstance(error, HydraException) and error.__cause__ is not None else error
    if isinstance(cause, ConfigKeyError | ConfigAttributeError) and cause.full_key:
        return unknown_override(error, cause)
    if not (isinstance(cause, ValidationError) and cause.full_key):
        return None
    reason = cause.msg.splitlines()[0]
    if "expected one of [" in reason:
        reason = "allowed: " + reason.split("expected one of [", 1)[1].rstrip("]")
        value = str(cause.value)
        if (match := closest(value, reason.removeprefix("allowed: ").split(", "))) is not None:
            reason += f"; did you mean {match}?"
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
    Console(stderr=True).print(Text.assemble(("error:", "red"), " ", message), highlight=False, soft_wrap=True)


def what_is_intact(path: Path) -> str:
    """After a write failed (atomically: the file is as it was), what the same command again starts from."""
    if path.suffix == ".ckpt" and path.parent.name == "checkpoints":
        if (path.parent / "last.ckpt").exists():
            return "the last checkpoint (checkpoints/last.ckpt) is intact and the run resumes from it"
        return "no checkpoint was written yet, so the run starts again"
    if "ablation" in path.parts:
        return "the results saved so far (and an interrupted scan's partial sums) are intact and the scans resume"
    return "every file written before is intact (files are written whole or not at all)"


def fault_line(error: BaseException) -> str:
    """One line for a write the machine refused (write_fault(error) is not None): the file, why, what is intact and
    what to do."""
    fault = write_fault(error) or error
    path = Path(fault.filename) if getattr(fault, "filename", None) else None
    reason = getattr(fault, "strerror", None) or str(fault)
    if path is None:  # a library's own write (Hydra's config and log files): its file object does not say which
        return (
            f"could not write a file ({reason}); every file written before is intact (files are written whole or not "
            "at all): free space and run the same command again"
        )
    if fault.errno in READ_ONLY_ERRNOS:
        return (
            f"cannot write in {path.parent} ({reason}: {path.name}); nothing there was changed: run the command on "
            "writable storage"
        )
    return f"could not write {path} ({reason}); {what_is_intact(path)}: free space and run the same command again"


def exit_on_config_error(fn: Callable) -> Callable:
    """Bad input becomes one line on stderr and exit code 2 (a diverged run: exit 1), not a traceback; so does a write
    the machine refused (disk full, read-only storage: exit 1)."""

    @functools.wraps(fn)  # Hydra names the job (and its log file) after the task function
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (*BAD_INPUT, ValueError) as e:
            if not isinstance(e, BAD_INPUT) and group_set_to_null(e) is None:
                raise
            print_error(describe(e))
            sys.exit(2)
        except Exception as e:
            if write_fault(e) is not None:
                print_error(fault_line(e))
                sys.exit(1)
            if (line := peers.peer_gone()) is not None:  # a collective failed because a process of the job died
                if not peers.claim_ending():
                    threading.Event().wait()  # a watcher is saying it, and ends the process
                print_error(line)
                sys.exit(1)
            # Imported here: headcount-report uses this module and starts faster without Lightning
            from headcount.train.module import NonFiniteLossError

            if not isinstance(e, NonFiniteLossError):
                raise
            print_error(str(e))
            sys.exit(1)

    return wrapped


def holds_only_hydra_files(folder: Path) -> bool:
    return folder.is_dir() and all(p.name in HYDRA_FILES or p.suffix == ".log" for p in folder.iterdir())


@contextmanager
def discarded_if_rejected(folder: Path, run_dir: Path | None = None) -> Iterator[None]:
    """Hydra's folder for a command that then refused its input goes again, if nothing but Hydra's files (.hydra/ and
    the log) and our lock are in it, and so do the folders it leaves empty up to run_dir (default: the folder itself):
    no half-made run is left that looks like one. Only the holder of run_dir's lock may remove anything."""
    folder = folder.resolve()
    run_dir = folder if run_dir is None else run_dir.resolve()
    try:
        yield
    except BAD_INPUT:
        if run_lock.holds(run_dir) and holds_only_hydra_files(folder):
            if folder == run_dir:
                run_lock.release(run_dir)
            shutil.rmtree(folder, ignore_errors=True)
            for parent in folder.parents:
                if parent == run_dir or not parent.is_relative_to(run_dir) or any(parent.iterdir()):
                    break
                parent.rmdir()
        raise


class Terminated(BaseException):
    """SIGTERM outside training (training defers it to a step boundary: train/signals.py). A BaseException, as
    KeyboardInterrupt is for SIGINT, so that neither Hydra nor a sweep's next job takes it for a job's failure."""


def terminate(signum: int, frame: Any) -> None:
    raise Terminated


def run_hydra_command(hydra_main: Callable[[], Any]) -> None:
    """Run a @hydra.main function so that composition errors, too, come out as one line and exit code 2, and Ctrl-C
    or SIGTERM, at any moment, as one line and exit code 128 + the signal number."""
    os.environ["HYDRA_FULL_ERROR"] = "1"
    secondary = processes.launched_as_secondary()
    signal.signal(signal.SIGINT, signal.default_int_handler)  # an extra process's quiet start is over (cli/__init__)
    # hydra.utils logs a `_target_` that does not import as an ERROR of several lines; the one line said is ours
    logging.getLogger("hydra.utils").setLevel(logging.CRITICAL)
    signal.signal(signal.SIGTERM, terminate)
    try:
        exit_on_config_error(hydra_main)()
    except KeyboardInterrupt:
        if not secondary:  # every process of the terminal's group got Ctrl-C: the first says it
            print_error("interrupted; the same command again resumes where it stopped")
        sys.exit(128 + signal.SIGINT)
    except (Terminated, SystemExit) as e:
        # Lightning's SIGTERMException leaves training on SIGTERM with exit code 0
        if isinstance(e, SystemExit) and type(e).__name__ != "SIGTERMException":
            raise
        print_error("stopped by SIGTERM; the same command again resumes where it stopped")
        sys.exit(128 + signal.SIGTERM)
    finally:
        run_lock.release_all()

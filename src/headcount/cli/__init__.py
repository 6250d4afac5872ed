"""The commands: headcount-train, headcount-ablate and headcount-report, and what Hydra's multirun calls back."""

import os
import signal

if os.environ.get("LOCAL_RANK", "0") not in ("", "0"):  # processes.launched_as_secondary, before any other import
    # Ctrl-C reaches every process of the terminal's group: one of a job's extra processes still importing torch has
    # nothing to save and would print a KeyboardInterrupt traceback; it ends quietly, and the first says what happened.
    # (run_hydra_command restores Python's handler once the command starts.)
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(128 + signum))

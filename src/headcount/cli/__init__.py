"""The commands: headcount-train, headcount-ablate and headcount-report, and what Hydra's multirun calls back."""

import os
import signal
import sys

if os.environ.get("LOCAL_RANK", "0") not in ("", "0"):  # processes.launched_as_secondary, before any other import
    # Ctrl-C reaches every process of the terminal's group: one of a job's extra processes still importing torch has
    # nothing to save and would print a KeyboardInterrupt traceback; it ends quietly, and the first says what happened.
    # (run_hydra_command restores Python's handler once the command starts.)
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(128 + signum))

from headcount.train.quiet import FLAGS, verbosity  # noqa: E402 (after the handler: it comes first)

if verbosity() == 0 and not FLAGS.keys() & set(sys.argv[1:]):  # quiet, before torch is imported: it reads this once
    # torch's C++ log, where one node of a job started by hand waits at the rendezvous for another (c10d's socket
    # timeouts, each with a C++ stack), comes before the command's one line about it; whatever fails reaches Python as
    # an exception the command reports. Its ERROR lines are those lines, so only FATAL ones stay. -v or the user's
    # own TORCH_CPP_LOG_LEVEL keep them; the job's other processes inherit the setting.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")


from headcount.threads import passive_threads_by_default  # noqa: E402

passive_threads_by_default()  # before torch loads, which reads it once: OpenMP's threads sleep while they wait

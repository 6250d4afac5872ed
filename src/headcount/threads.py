"""How torch's CPU threads wait for work: asleep unless the user chose, so that a machine shared with other jobs
trains at its share of the cores rather than a fraction of it.

Between parallel regions OpenMP's threads (GNU libgomp in torch's CPU wheels) spin, waiting for the next one. Alone
on a machine that costs nothing; beside other jobs the spinning threads take the cores the thread with the work needs
(scripts/bench_shared.py, docs/BENCHMARKS.md: on this project's 2-core machine beside two busy processes, training ran
at a few percent of its passive speed). OMP_WAIT_POLICY=PASSIVE lets them sleep. The commands (cli/__init__.py) and
the test workers (tests/conftest.py) set it where the user has set neither a waiting policy nor a thread count:
whoever set one has chosen for their machine. OpenMP reads the environment once, when torch loads, so this runs before.
"""

import os
from collections.abc import MutableMapping

# A waiting policy (OpenMP's, GNU's spin count, Intel's block time) or a thread count the user chose
USER_CHOICES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def passive_threads_by_default(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Sets OMP_WAIT_POLICY=PASSIVE in `environ` unless one of USER_CHOICES is set there (to anything but an empty
    string); returns whether it did. Call it before torch loads; processes started from here inherit it."""
    if any(environ.get(key, "").strip() for key in USER_CHOICES):
        return False
    environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True

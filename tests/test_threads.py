"""headcount/threads.py: OMP_WAIT_POLICY=PASSIVE by default, only where the user chose neither a waiting policy nor
a thread count, set by the commands and by the test workers before torch loads (the speed it buys beside other jobs:
scripts/bench_shared.py, docs/BENCHMARKS.md)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from headcount.threads import USER_CHOICES, passive_threads_by_default

REPO = Path(__file__).resolve().parents[1]


def test_passive_where_the_user_chose_nothing():
    environ = {"PATH": "/usr/bin", "OMP_NUM_THREADS": ""}  # set to nothing: not a choice
    assert passive_threads_by_default(environ) is True
    assert environ["OMP_WAIT_POLICY"] == "PASSIVE"


@pytest.mark.parametrize("key", USER_CHOICES)
def test_a_users_policy_or_thread_count_is_left_alone(key):
    environ = {key: "ACTIVE" if key == "OMP_WAIT_POLICY" else "2"}
    before = dict(environ)
    assert passive_threads_by_default(environ) is False
    assert environ == before


def policy_seen(code: str, extra: dict[str, str], cwd: Path = REPO) -> str:
    """OMP_WAIT_POLICY, and whether torch had loaded, after `code` runs in a fresh interpreter whose environment has
    none of the user's choices but `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in USER_CHOICES}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO / "tests")])
    probe = f"{code}\nimport os, sys\nprint(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", probe], env={**env, **extra}, cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split("\n")[-2]


@pytest.mark.parametrize(
    ("extra", "seen"),
    [({}, "PASSIVE"), ({"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE"), ({"OMP_NUM_THREADS": "1"}, "None")],
)
def test_the_commands_set_it_before_torch_loads(extra, seen):
    assert policy_seen("import headcount.cli.train", extra) == f"{seen} False"


@pytest.mark.parametrize(
    ("extra", "seen"),
    [({}, "PASSIVE"), ({"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE"), ({"MKL_NUM_THREADS": "2"}, "None")],
)
def test_the_test_workers_set_it_before_torch_loads(extra, seen):
    """tests/conftest.py, which every pytest-xdist worker imports first, sets it, then loads torch."""
    assert policy_seen("import conftest", extra, cwd=REPO / "tests") == f"{seen} True"

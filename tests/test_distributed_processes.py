"""The processes of one job (trainer.devices=2: Lightning's DDP launcher starts the second) end together and say why:
one killed stops the other with one line, none is left orphaned, Ctrl-C while the second is still starting prints no
traceback, and more nodes than there are is refused before anything starts; nodes joined by hand give up on one that
never comes after trainer.rendezvous_timeout_s, in one line, and collectives after the join keep torch's timeout.

Each test trains in two CPU processes (gloo), one thread each, in a process group of its own.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from headcount import run_lock
from headcount.cli.sweep_stop import descendants
from headcount.run_dir import RunPaths

REPO = Path(__file__).resolve().parents[1]
# long enough never to finish while the test watches; last.ckpt at step 1 says that both processes are training
TRAIN = ["model=tiny", "data=induction", "trainer=smoke", "logger=none", "ablation=[]", "data.n_train=64"]
TRAIN += ["data.n_val=16", "data.n_test=16", "trainer.progress_bar=false", "trainer.max_steps=100000"]
TRAIN += ["trainer.val_check_interval=100000", "trainer.checkpoint_every_n_steps=1"]
TWO_PROCESSES = ["trainer.devices=2", "trainer.accelerator=cpu", "trainer.strategy=ddp"]
RESUMES = "the same command again resumes where it stopped"


def start(run_dir: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    args = [sys.executable, "-m", "headcount.cli.train", *TRAIN, *TWO_PROCESSES, f"hydra.run.dir={run_dir}"]
    return subprocess.Popen(
        args, cwd=run_dir.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip


def wait_for(condition, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.05)


def second_process(main: subprocess.Popen) -> int | None:
    found = [pid for pid, args in descendants(main.pid).items() if "train_ddp_process_1" in args]
    return found[0] if found else None


def alive(pid: int) -> bool:
    """Whether pid runs (a zombie, ended but not yet reaped by whoever adopted it, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def training(main: subprocess.Popen, run_dir: Path) -> int:
    """The second process's pid, once both processes train (last.ckpt written after step 1)."""
    wait_for(lambda: second_process(main) is not None, "second process")
    wait_for(lambda: RunPaths(run_dir).last_ckpt.exists(), "first checkpoint")
    return second_process(main)


def stop_all(main: subprocess.Popen) -> None:
    for pid in [*descendants(main.pid), main.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_the_scans_wait_for_the_first_process_to_finish_the_run(tmp_path):
    """One two-process training run in four exited with an error: the second process started the scans, which open
    the finished run, before the first had written metrics.json ("has no finished training run"). Forced here: the
    first process writes it 5 s late (tests/slow_first_writer.py)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src"), "HEADCOUNT_TEST_WRITE_DELAY_S": "5"}
    run_dir = tmp_path / "run"
    short = [
        *(arg for arg in TRAIN[:-3] if arg != "ablation=[]"),
        "trainer.max_steps=4",
        "trainer.val_check_interval=4",
        "ablation=[baseline]",
    ]
    args = [sys.executable, str(REPO / "tests" / "slow_first_writer.py"), *short, *TWO_PROCESSES]
    proc = subprocess.run(
        [*args, f"hydra.run.dir={run_dir}"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0 and "error" not in proc.stderr, proc.stderr[-3000:]
    assert RunPaths(run_dir).done.exists() and (RunPaths(run_dir).ablation / "summary.json").exists()


@pytest.fixture
def run_dir(tmp_path) -> Path:
    return tmp_path / "run"


@pytest.mark.slow
def test_killing_the_second_process_stops_the_first_with_one_line(run_dir):
    """The command exited 137 (Lightning's observer kills its own process with SIGKILL) and printed nothing; the lock
    file was left behind."""
    main = start(run_dir)
    try:
        os.kill(training(main, run_dir), signal.SIGKILL)
        _, err = main.communicate(timeout=60)
    finally:
        stop_all(main)
    lines = err.strip().splitlines()
    assert main.returncode == 1, err[-3000:]
    assert lines[-1] == f"error: process 1 of 2 was killed by SIGKILL; the other was stopped: {RESUMES}", err[-3000:]
    assert "Traceback" not in err
    assert not (run_dir / ".lock").exists()


@pytest.mark.slow
def test_killing_the_first_process_leaves_no_orphan(run_dir):
    """The second process went on, orphaned, for minutes; later it ended with the line, but after its traceback of
    130 lines, each prefixed `[rank1]:` by torch (the gloo collective's "Connection reset by peer"): the process no
    longer knew it had been the first one's child once the first was gone."""
    main = start(run_dir)
    try:
        second = training(main, run_dir)
        os.kill(main.pid, signal.SIGKILL)
        main.wait(timeout=10)
        wait_for(lambda: not alive(second), "end of the orphaned second process", timeout=15)
        _, err = main.communicate(timeout=10)
    finally:
        stop_all(main)
        if alive(second):
            os.kill(second, signal.SIGKILL)
    assert err.strip().splitlines()[-1] == (
        f"error: process 0 of 2 ended (pid {main.pid}); process 1 stopped with it: {RESUMES}"
    ), err[-3000:]
    assert "Traceback" not in err and "[rank1]" not in err, err[-3000:]


@pytest.mark.slow
def test_ctrl_c_while_the_second_process_starts_prints_no_traceback(run_dir):
    """The second process, interrupted while importing torch, printed its KeyboardInterrupt traceback."""
    main = start(run_dir)
    try:
        wait_for(lambda: second_process(main) is not None, "second process")
        time.sleep(1)  # past the interpreter's own start: importing headcount, rich, torch, Lightning
        os.killpg(main.pid, signal.SIGINT)  # the terminal's Ctrl-C: every process of the group
        _, err = main.communicate(timeout=120)
        left = descendants(main.pid)
    finally:
        stop_all(main)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == f"error: interrupted; {RESUMES}", err[-3000:]
    assert main.returncode == 130 and not left


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("command", ["train", pytest.param("ablate", marks=pytest.mark.slow)])
def test_a_node_that_never_comes_ends_the_join_in_one_line_within_the_timeout(tmp_path, command):
    """Nodes joined by hand (MASTER_ADDR, NODE_RANK) waited torch.distributed's 30 minutes, silent, for a node that
    was never started. Node 0 of two, alone on localhost, gives up after trainer.rendezvous_timeout_s, naming who did
    not come and where, with its run's lock released; training and a scan alike."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NODE_RANK": "0"}
    env.pop("TORCH_CPP_LOG_LEVEL", None)  # the command's own setting: torch's C++ log kept out of its one line
    run_dir = tmp_path / "run"
    train = [
        sys.executable,
        "-m",
        "headcount.cli.train",
        *TRAIN[:-3],
        "trainer.max_steps=2",
        f"hydra.run.dir={run_dir}",
    ]
    nodes = ["trainer.num_nodes=2", "trainer.rendezvous_timeout_s=3"]
    if command == "ablate":  # a finished run first, then one scan over two nodes
        subprocess.run([*train, "ablation=[single_head]"], cwd=tmp_path, env=env, check=True, capture_output=True)
        args = [sys.executable, "-m", "headcount.cli.ablate", f"run_dir={run_dir}", "ablation=[single_head]", *nodes]
        (RunPaths(run_dir).ablation / "summary.json").unlink()  # so that the scan is not up to date
    else:
        args = [*train, *nodes]
    proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # not 30 minutes
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines[0] == (
        f"error: trainer.num_nodes=2: 1 of the job's 2 processes joined at 127.0.0.1:{port} within "
        "trainer.rendezvous_timeout_s=3 s: no other node came (NODE_RANK 1 to 1); start each node with the same "
        "MASTER_ADDR and MASTER_PORT and its own NODE_RANK, or raise trainer.rendezvous_timeout_s"
    )
    run_lock.check_free(run_dir, "run_dir", str(run_dir))  # released: the same command may go again at once
    assert RunPaths(run_dir).metrics.exists() == (command == "ablate")  # nothing trained


def test_a_node_whose_node_0_never_comes_says_so_in_one_line(tmp_path):
    """Node 1 of two, with no node 0 at MASTER_ADDR: torch's C++ log printed c10d's socket timeouts, each with a C++
    stack (21 lines), before the one line; the command keeps its C++ log to FATAL unless the user sets it."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NODE_RANK": "1"}
    env.pop("TORCH_CPP_LOG_LEVEL", None)
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "headcount.cli.train", *TRAIN[:-3], "trainer.max_steps=2", f"hydra.run.dir={run_dir}"]
    args += ["trainer.num_nodes=2", "trainer.rendezvous_timeout_s=3"]
    proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-3000:]
    assert proc.stderr.startswith(
        f"error: trainer.num_nodes=2: this node (NODE_RANK=1) reached no rendezvous at 127.0.0.1:{port} within "
        "trainer.rendezvous_timeout_s=3 s: node 0 is not there"
    )
    run_lock.check_free(run_dir, "run_dir", str(run_dir))


def test_after_the_join_collectives_wait_torchs_default_not_the_join_timeout(monkeypatch):
    """The join's short timeout would also cut collectives short: a process waiting at an all-reduce for a slower one
    (a larger share of masks, a checkpoint being written) would fail after trainer.rendezvous_timeout_s."""
    import torch
    import torch.distributed as dist
    from lightning.fabric.plugins.environments import LightningEnvironment
    from lightning.pytorch.strategies import DDPStrategy

    from headcount.train.rendezvous import BoundedRendezvous

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    cpu = {"parallel_devices": [torch.device("cpu")], "cluster_environment": LightningEnvironment()}
    timeouts = {}
    for name, strategy in (("plain", DDPStrategy(timeout=timedelta(seconds=3), **cpu)), ("bounded", None)):
        strategy = strategy or BoundedRendezvous(3, num_nodes=2, **cpu)
        monkeypatch.setenv("MASTER_PORT", str(free_port()))
        strategy.setup_distributed()  # a world of one process: joined at once
        try:
            gloo = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
            timeouts[name] = (gloo.options._timeout, dist.distributed_c10d._get_default_store().timeout)
        finally:
            dist.destroy_process_group()
    assert timeouts["plain"] == (timedelta(seconds=3),) * 2  # what the test would see without the fix
    assert (
        timeouts["bounded"] == (dist.distributed_c10d._get_default_timeout("gloo"),) * 2 == (timedelta(minutes=30),) * 2
    )

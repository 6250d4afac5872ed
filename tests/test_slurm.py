"""A real SLURM cluster (scripts/slurm_local.sh: munged, slurmctld and slurmd on this machine) runs a 2-job sweep
through hydra/launcher=slurm. Mid-training, one job is requeued from outside (`scontrol requeue`, as an admin or a
preemption would) and the other gets the signal SLURM sends before a timeout (USR2: submitit requeues the job itself).
Both must resume from their last.ckpt and end with the numbers of the same jobs run without interruption.

Needs root and apt (slurm-wlm and munge are installed if missing); skipped otherwise. About 3 minutes on 2 cores.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from sweep_helpers import run_dirs

from headcount.run_dir import RunPaths

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "slurm_local.sh"
# 300 steps, a checkpoint every 50: the interruptions land right after the first checkpoint, far from the end.
TRAIN = ["model=tiny", "data=induction", "data.n_train=2048", "data.n_val=64", "data.n_test=64", "seed=0,1"]
TRAIN += ["trainer.max_steps=300", "trainer.val_check_interval=50", "trainer.progress_bar=false", "ablation=[]"]
# The local cluster has no GPUs and 2 cores: one core per job, both at once. (Its partition `local` is the default.)
LOCAL_CLUSTER = ["hydra.launcher.partition=local", "hydra.launcher.gpus_per_node=null"]
LOCAL_CLUSTER += ["hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1", "hydra.launcher.timeout_min=10"]
DEADLINE_S = 600  # about 3 minutes on 2 idle cores; twice that when other work shares them


def free_port_pair() -> int:
    """A port for slurmctld whose next one (slurmd's) is free too, so the test's cluster never meets another."""
    for port in range(16817, 17817, 2):
        try:
            for p in (port, port + 1):
                with socket.socket() as s:
                    s.bind(("", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for the SLURM daemons")


@pytest.fixture(scope="module")
def slurm_env():
    """Starts a one-node cluster in a folder of its own; yields the environment that points commands at it."""
    if os.geteuid() != 0:
        pytest.skip("the local SLURM cluster needs root (apt-get, and daemons that run jobs as any user)")
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="needs hydra-submitit-launcher")
    # Not under pytest's tmp_path: munged wants every folder above its socket open to all, and pytest's are private.
    cluster = Path(tempfile.mkdtemp(prefix="headcount-slurm-test-"))
    script = [str(SCRIPT), "--dir", str(cluster)]
    install = subprocess.run([script[0], "install", *script[1:]], capture_output=True, text=True)
    if install.returncode != 0:
        pytest.skip(f"apt cannot provide slurm-wlm and munge: {install.stderr.strip()}")
    env = {**os.environ, "HEADCOUNT_SLURM_PORT": str(free_port_pair())}
    start = subprocess.run([script[0], "start", *script[1:]], capture_output=True, text=True, env=env)
    assert start.returncode == 0, start.stdout + start.stderr
    try:
        yield {**os.environ, "SLURM_CONF": str(cluster / "slurm.conf"), "OMP_NUM_THREADS": "1"}
    finally:
        subprocess.run([script[0], "stop", *script[1:]], capture_output=True, text=True)
        shutil.rmtree(cluster)


def slurm(args: list[str], env: dict) -> str:
    return subprocess.run(args, env=env, capture_output=True, text=True, check=True).stdout


def wait_for(condition, what: str, deadline: float, explain) -> None:
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{explain()}"
        time.sleep(0.2)


def training_numbers(run_dir: Path) -> dict:
    """What a run computed (its losses and accuracies, steps, thread count), not how long it took."""
    metrics = json.loads(RunPaths(run_dir).metrics.read_text())
    return {k: v for k, v in metrics.items() if k.startswith(("val/", "test/")) or k in ("steps", "cpu_threads")}


@pytest.mark.slow
def test_requeued_sweep_jobs_resume_and_match_uninterrupted_runs(slurm_env, tmp_path):
    deadline = time.monotonic() + DEADLINE_S
    train = [sys.executable, "-m", "headcount.cli.train", "-m", *TRAIN]
    logs = {name: open(tmp_path / f"{name}.log", "w") for name in ("slurm", "uninterrupted")}  # noqa: SIM115
    sweep = subprocess.Popen(
        [*train, "hydra/launcher=slurm", *LOCAL_CLUSTER, "sweep_name=slurm"],
        cwd=tmp_path,
        env=slurm_env,
        stdout=logs["slurm"],
        stderr=subprocess.STDOUT,
    )
    # The same two jobs, one after the other in one process, without SLURM (sweep_name stays out of folder names).
    reference = subprocess.Popen(
        [*train, "sweep_name=uninterrupted"],
        cwd=tmp_path,
        env=slurm_env,
        stdout=logs["uninterrupted"],
        stderr=subprocess.STDOUT,
    )

    def explain() -> str:
        queue = subprocess.run(["squeue", "-r"], env=slurm_env, capture_output=True, text=True)
        return queue.stdout + queue.stderr + (tmp_path / "slurm.log").read_text()[-4000:]

    try:
        sweep_dir = tmp_path / "outputs" / "multirun" / "slurm"
        wait_for(lambda: len(run_dirs(sweep_dir)) == 2, "both jobs to start", deadline, explain)
        preempted, requeued = run_dirs(sweep_dir)  # seed=0 and seed=1, array tasks 0 and 1
        array_ids = sorted(slurm(["squeue", "-h", "-r", "-o", "%i"], slurm_env).split())
        assert len(array_ids) == 2 and all(re.fullmatch(r"\d+_[01]", i) for i in array_ids), array_ids
        for run_dir, array_id, interrupt in [
            (preempted, array_ids[0], ["scancel", "--signal=USR2", array_ids[0]]),  # what SLURM sends before a timeout
            (requeued, array_ids[1], ["scontrol", "requeue", array_ids[1]]),
        ]:
            paths = RunPaths(run_dir)
            wait_for(paths.last_ckpt.exists, f"{run_dir.name}'s first checkpoint", deadline, explain)
            assert not paths.metrics.exists(), f"job {array_id} finished training before it could be interrupted"
            slurm(interrupt, slurm_env)
        sweep.wait(timeout=max(1.0, deadline - time.monotonic()))
        reference.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc in (sweep, reference):
            if proc.poll() is None:
                proc.kill()
        for log in logs.values():
            log.close()
    assert sweep.returncode == 0, explain()
    assert reference.returncode == 0, (tmp_path / "uninterrupted.log").read_text()[-4000:]

    uninterrupted = dict(zip((preempted, requeued), run_dirs(tmp_path / "outputs" / "multirun" / "uninterrupted")))
    differences = {}
    for seed, (run_dir, array_id) in enumerate(zip((preempted, requeued), array_ids)):
        assert RunPaths(run_dir).done.exists()
        job = slurm(["scontrol", "-o", "show", "job", array_id], slurm_env)
        assert "Restarts=1 " in job, f"job {array_id} was not requeued once: {job}"
        run_log = "".join(log.read_text() for log in run_dir.glob("*.log"))  # Hydra's job log, <job name>.log
        assert "resuming from" in run_log and "last.ckpt" in run_log, run_log
        assert uninterrupted[run_dir].name == run_dir.name
        got, want = training_numbers(run_dir), training_numbers(uninterrupted[run_dir])
        differ = {k: f"uninterrupted {want[k]!r}, requeued {got.get(k)!r}" for k in want if got.get(k) != want[k]}
        if differ:
            differences[f"job {array_id} (seed={seed})"] = differ
    assert not differences, f"requeued jobs ended with other numbers than uninterrupted ones: {differences}"


@pytest.mark.slow
def test_a_scan_runs_as_one_two_task_slurm_job(slurm_env, tmp_path):
    """headcount-ablate through hydra/launcher=slurm with tasks_per_node=2 and trainer.devices=2: SLURM starts the two
    processes (Lightning reads their ranks from SLURM), and the tables equal those of one process here."""
    train = [sys.executable, "-m", "headcount.cli.train", "model=tiny", "data=induction", "trainer=smoke"]
    train += ["data.n_train=64", "data.n_val=64", "ablation=[]", f"hydra.run.dir={tmp_path / 'run'}"]
    subprocess.run(train, cwd=tmp_path, env=slurm_env, check=True, capture_output=True)
    shutil.copytree(tmp_path / "run", tmp_path / "one")
    ablate = [sys.executable, "-m", "headcount.cli.ablate"]
    scans = ["ablation=[single_head,pairs]", "ablation.progress=false"]
    two_tasks = ["hydra/launcher=slurm", *LOCAL_CLUSTER, "hydra.launcher.tasks_per_node=2"]
    two_tasks += ["trainer.devices=2", "trainer.accelerator=cpu", "trainer.strategy=ddp"]
    job = subprocess.run(
        [*ablate, "-m", f"run_dir={tmp_path / 'run'}", *scans, *two_tasks],
        cwd=tmp_path,
        env=slurm_env,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    logs = "".join(p.read_text() for p in (tmp_path / "run" / "ablation" / "logs").rglob("*.log"))
    assert job.returncode == 0, job.stderr[-3000:] + logs[-3000:]
    subprocess.run([*ablate, f"run_dir={tmp_path / 'one'}", *scans], cwd=tmp_path, env=slurm_env, check=True)
    summary = json.loads((RunPaths(tmp_path / "run").ablation / "summary.json").read_text())
    assert {entry["processes"] for entry in summary["modes"]["zero"]["scans"].values()} == {2}
    for table in ("single_head.csv", "pairs.csv"):
        assert (RunPaths(tmp_path / "run").ablation / table).read_text() == (
            RunPaths(tmp_path / "one").ablation / table
        ).read_text()

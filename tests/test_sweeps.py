"""Sweeps with Hydra multirun: each job finishes its own run directory, whatever the launcher; the same command again
skips finished jobs and resumes the rest; bad input fails before any job starts; GPUs are shared out one per job."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf, open_dict

from headcount import gpus, training
from headcount.config import CONF_DIR
from headcount.gpus import claim_gpu, visible_gpu_ids
from headcount.report import write_report
from headcount.run_dir import RunPaths

REPO = Path(__file__).resolve().parents[1]
SMOKE = ["model=tiny", "data=induction", "trainer=smoke", "data.n_train=64", "data.n_val=32", "data.n_test=32"]
GRID_EXPERIMENT = """# @package _global_
experiment: grid2x2
hydra:
  sweeper:
    params:
      model.attn.n_heads: 1,2
      seed: 0,1
"""


def headcount(module_args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, *module_args], cwd=cwd, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def run_dirs(sweep: Path) -> list[Path]:
    return sorted(p.parent.parent for p in sweep.glob("*/.hydra/overrides.yaml"))


def report_rows(sweep: Path) -> pd.DataFrame:
    write_report(sweep)
    return pd.read_csv(sweep / "report" / "runs.csv")


@pytest.fixture(scope="module")
def grid_sweep(tmp_path_factory) -> tuple[Path, list[str]]:
    """A 2x2 grid (n_heads x seed) stored in an experiment file, run with the basic launcher: (sweep dir, the
    headcount-train arguments)."""
    root = tmp_path_factory.mktemp("grid")
    (root / "conf" / "experiment").mkdir(parents=True)
    (root / "conf" / "experiment" / "grid2x2.yaml").write_text(GRID_EXPERIMENT)
    args = ["-m", f"--config-dir={root / 'conf'}", "experiment=grid2x2", *SMOKE]
    args += ["ablation=single_head", "ablation.progress=false"]
    headcount(["-m", "headcount.training", *args], cwd=root)
    return root / "outputs" / "multirun" / "grid2x2", args


def test_grid_from_an_experiment_file_finishes_four_runs_and_a_report(grid_sweep):
    sweep, _ = grid_sweep
    runs = run_dirs(sweep)
    assert [r.name.split(",model=tiny,")[0].split(",model.attn.")[1] for r in runs] == [
        "n_heads=1",
        "n_heads=1",
        "n_heads=2",
        "n_heads=2",
    ]
    for run_dir in runs:
        paths = RunPaths(run_dir)
        assert paths.done.exists() and paths.metrics.exists() and (paths.ablation / "single_head.csv").exists()
        assert "experiment" not in run_dir.name  # the sweep folder carries the experiment's name
    headcount([str(REPO / "scripts" / "report.py"), str(sweep)], cwd=sweep)
    rows = pd.read_csv(sweep / "report" / "runs.csv")
    assert len(rows) == 4 and set(rows["status"]) == {"finished"}
    assert sorted(zip(rows["model.attn.n_heads"], rows["seed"])) == [(1, 0), (1, 1), (2, 0), (2, 1)]


def test_submitit_local_sweep_finishes_four_runs(tmp_path):
    """submitit_local: the SLURM launcher's code path (pickled jobs in their own processes), on this machine."""
    grid = ["model.attn.n_heads=1,2", "seed=0,1", "sweep_name=cluster"]
    headcount(["-m", "headcount.training", "-m", "hydra/launcher=submitit_local", *SMOKE, *grid], cwd=tmp_path)
    sweep = tmp_path / "outputs" / "multirun" / "cluster"
    assert len(run_dirs(sweep)) == 4 and all(RunPaths(r).done.exists() for r in run_dirs(sweep))
    assert (sweep / ".submitit").is_dir()
    assert set(report_rows(sweep)["status"]) == {"finished"}


def train_in_process(monkeypatch, cwd: Path, args: list[str]) -> int:
    """headcount-train <args> in this process, from cwd; returns its exit code."""
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", ["headcount-train", *args])
    GlobalHydra.instance().clear()
    try:
        training.main()
    except SystemExit as e:
        return e.code
    return 0


def test_rerun_skips_finished_jobs_and_resumes_interrupted_ones(grid_sweep, monkeypatch, capsys):
    sweep, args = grid_sweep
    runs = [RunPaths(r) for r in run_dirs(sweep)]
    mtimes = [p.last_ckpt.stat().st_mtime_ns for p in runs]
    interrupted_training, interrupted_ablation, *finished = runs
    # Training stopped after its last checkpoint, before metrics.json and DONE.
    interrupted_training.metrics.unlink()
    interrupted_training.done.unlink()
    # An ablation scan killed mid-write: no CSV yet, a truncated partial file, no DONE.
    scan = interrupted_ablation.ablation / "single_head.csv"
    before = pd.read_csv(scan)
    scan.unlink()
    (interrupted_ablation.ablation / "single_head.partial.csv").write_text("# fingerprint=")
    interrupted_ablation.done.unlink()

    # The same command again (in this process: the basic launcher runs every job in the process that started it).
    assert train_in_process(monkeypatch, sweep.parents[2], args) == 0
    assert capsys.readouterr().err.count("already finished") == 2
    assert [p.last_ckpt.stat().st_mtime_ns for p in finished] == mtimes[2:]  # finished jobs untouched
    assert all(p.done.exists() for p in runs) and interrupted_training.metrics.exists()
    pd.testing.assert_frame_equal(pd.read_csv(scan), before)
    assert not (interrupted_ablation.ablation / "single_head.partial.csv").exists()
    assert len(run_dirs(sweep)) == 4 and len(report_rows(sweep)) == 4  # nothing duplicated


@pytest.mark.parametrize(
    "sweep, message",
    [
        (["model.attn.n_head=1,2"], "Key 'n_head' not in 'AttentionConfig'"),
        (["model.attn.n_heads=4,3"], "model.attn.n_heads=3: must divide"),
        (["seed=0,1", "logger=wandb", "logger.wandb.project=team/heads"], "logger.wandb.project='team/heads'"),
    ],
)
def test_bad_sweep_fails_in_one_line_before_any_job(monkeypatch, tmp_path, capsys, sweep, message):
    assert train_in_process(monkeypatch, tmp_path, ["-m", *SMOKE, *sweep]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "no job started" in err and len(err.splitlines()) == 1, err
    assert not list(tmp_path.glob("outputs/multirun/*/*/.hydra"))


@pytest.mark.parametrize(
    "launcher, module, package",
    [
        ("joblib", "hydra_plugins.hydra_joblib_launcher", "hydra-joblib-launcher"),
        ("parallel", "hydra_plugins.hydra_joblib_launcher", "hydra-joblib-launcher"),
        ("submitit_local", "hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher"),
        ("slurm", "hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher"),
    ],
)
def test_missing_launcher_plugin_names_the_package(monkeypatch, tmp_path, capsys, launcher, module, package):
    monkeypatch.setitem(sys.modules, module, None)  # what `import` sees when the package is not installed
    assert train_in_process(monkeypatch, tmp_path, ["-m", f"hydra/launcher={launcher}", "seed=0,1"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"pip install {package}" in err and len(err.splitlines()) == 1, err


def compose_with_hydra(overrides: list[str]):
    GlobalHydra.instance().clear()
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        return compose("train", overrides=overrides, return_hydra_config=True)


@pytest.mark.parametrize(
    "launcher, target",
    [
        ("basic", "BasicLauncher"),
        ("joblib", "JoblibLauncher"),
        ("parallel", "JoblibLauncher"),
        ("submitit_local", "LocalLauncher"),
        ("submitit_slurm", "SlurmLauncher"),
        ("slurm", "SlurmLauncher"),
    ],
)
def test_launcher_configs_extend_the_plugins(launcher, target):
    overrides = [f"hydra/launcher={launcher}"] + (["hydra.launcher.timeout_min=5"] if launcher == "slurm" else [])
    cfg = compose_with_hydra(overrides)
    assert cfg.hydra.launcher._target_.endswith(target)
    if launcher == "parallel":
        assert cfg.hydra.launcher.n_jobs == (torch.cuda.device_count() or -1)
    if launcher == "slurm":
        assert (cfg.hydra.launcher.gpus_per_node, cfg.hydra.launcher.max_num_timeout) == (1, 3)
        assert cfg.hydra.launcher.timeout_min == 5 and "partition" in cfg.hydra.launcher


@pytest.mark.parametrize(
    "overrides, folder",
    [([], "outputs/multirun/sweep"), (["sweep_name=heads_vs_combine"], "outputs/multirun/heads_vs_combine")],
)
def test_sweep_folder_is_a_pure_function_of_the_command(overrides, folder):
    assert compose_with_hydra(overrides).hydra.sweep.dir == folder


def test_each_job_claims_a_gpu_no_other_job_holds(tmp_path):
    ids = ["0", "1"]
    with claim_gpu(ids, preferred=0, lock_dir=tmp_path) as first:
        with claim_gpu(ids, preferred=0, lock_dir=tmp_path) as second:
            assert (first, second) == (0, 1)
            with claim_gpu(ids, preferred=3, lock_dir=tmp_path) as shared:
                assert shared == 1  # every GPU is held: the preferred one (3 mod 2), shared
        with claim_gpu(ids, preferred=1, lock_dir=tmp_path) as again:
            assert again == 1  # released when its job ended


def test_gpu_names_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert visible_gpu_ids(2) == ["3", "5"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_gpu_ids(2) == ["0", "1"]


@pytest.mark.parametrize(
    "trainer, n_gpus, multirun, wanted",
    [
        ({"accelerator": "gpu", "devices": 1}, 4, True, True),
        ({"accelerator": "auto", "devices": 1}, 2, True, True),
        ({"accelerator": "gpu", "devices": 1}, 4, False, False),  # a single run keeps the usual GPU choice
        ({"accelerator": "gpu", "devices": 1}, 1, True, False),
        ({"accelerator": "gpu", "devices": "auto"}, 4, True, False),  # DDP inside the job takes them all
        ({"accelerator": "cpu", "devices": 1}, 4, True, False),
    ],
)
def test_which_jobs_need_their_own_gpu(trainer, n_gpus, multirun, wanted):
    assert gpus.needs_own_gpu(OmegaConf.create(trainer), n_gpus, multirun) == wanted


def test_a_sweep_job_trains_on_the_gpu_it_claimed(monkeypatch, tmp_path):
    """The wiring, without GPUs: job 3 of a sweep on a 2-GPU machine gets GPU 1 for Lightning and for torch."""
    cfg = compose_with_hydra([*SMOKE, "trainer.accelerator=gpu"])
    with open_dict(cfg.hydra):
        cfg.hydra.mode, cfg.hydra.job.num = RunMode.MULTIRUN, 3
    monkeypatch.setattr(HydraConfig.instance(), "cfg", None)
    HydraConfig.instance().set_config(cfg)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    torch_devices = []
    monkeypatch.setattr(torch.cuda, "set_device", torch_devices.append)
    monkeypatch.setattr(gpus, "claim_gpu", lambda ids, preferred: claim_gpu(ids, preferred, lock_dir=tmp_path))
    with gpus.own_gpu_in_a_sweep(cfg):
        assert cfg.trainer.devices == [1] and torch_devices == [1]


@pytest.mark.slow
def test_ddp_jobs_in_a_sweep_train_in_their_own_run_directories(tmp_path):
    """Lightning's DDP launcher reruns the command line for its second process: in a multirun each child must train
    its parent's job in the parent's directory, not launch the whole sweep again. Two CPU processes (gloo) stand in
    for two GPUs."""
    ddp = ["seed=0,1", "trainer.devices=2", "trainer.strategy=ddp", "sweep_name=ddp"]
    proc = headcount(["-m", "headcount.training", "-m", *SMOKE, *ddp], cwd=tmp_path)
    assert (proc.stdout + proc.stderr).count("Launching 2 jobs") == 1  # children ran single jobs, not the sweep
    runs = run_dirs(tmp_path / "outputs" / "multirun" / "ddp")
    assert [r.name.split("seed=")[1][0] for r in runs] == ["0", "1"]
    for run_dir in runs:
        assert RunPaths(run_dir).done.exists() and (run_dir / "train_ddp_process_1.log").exists()
    assert os.listdir(tmp_path / "outputs") == ["multirun"]  # nothing in the single-run folder

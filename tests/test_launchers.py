"""Launchers: Hydra's plugins extended by conf/hydra/launcher/, submitit_local as the cluster stand-in, a missing
plugin named with its package, one GPU per job, DDP inside a sweep job."""

import os
import sys

import pytest
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf, open_dict
from sweep_helpers import SMOKE, compose_with_hydra, report_rows, run_dirs, run_python, train_in_process

from headcount.run_dir import RunPaths
from headcount.train import launch as gpus
from headcount.train.launch import claim_gpu, visible_gpu_ids


def test_submitit_local_sweep_finishes_four_runs(tmp_path):
    """submitit_local: the SLURM launcher's code path (pickled jobs in their own processes), on this machine."""
    grid = ["model.attn.n_heads=1,2", "seed=0,1", "sweep_name=cluster"]
    run_python(["-m", "headcount.cli.train", "-m", "hydra/launcher=submitit_local", *SMOKE, *grid], cwd=tmp_path)
    sweep = tmp_path / "outputs" / "multirun" / "cluster"
    assert len(run_dirs(sweep)) == 4 and all(RunPaths(r).done.exists() for r in run_dirs(sweep))
    assert (sweep / ".submitit").is_dir()
    assert set(report_rows(sweep)["status"]) == {"finished"}


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
        # submitit's answer to a time limit is `scontrol requeue`, which clusters with JobRequeue=0 allow only to
        # jobs submitted with --requeue (tests/test_slurm.py runs such a cluster)
        assert cfg.hydra.launcher.additional_parameters == {"requeue": True}


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
    proc = run_python(["-m", "headcount.cli.train", "-m", *SMOKE, *ddp], cwd=tmp_path)
    assert (proc.stdout + proc.stderr).count("Launching 2 jobs") == 1  # children ran single jobs, not the sweep
    runs = run_dirs(tmp_path / "outputs" / "multirun" / "ddp")
    assert [r.name.split("seed=")[1][0] for r in runs] == ["0", "1"]
    for run_dir in runs:
        assert RunPaths(run_dir).done.exists() and (run_dir / "train_ddp_process_1.log").exists()
    assert os.listdir(tmp_path / "outputs") == ["multirun"]  # nothing in the single-run folder

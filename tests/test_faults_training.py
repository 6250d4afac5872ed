"""Faults during training: a run killed (kill -9), stopped (Ctrl-C, SIGTERM) at any moment and started again ends bit
for bit where the uninterrupted run ends, its curves holding every logged step once; a damaged last.ckpt is refused
before anything is touched; checkpoints and curves are written so that a kill never leaves them damaged; W&B failing
at start never stops a run.

The interrupted runs are subprocesses that send themselves a signal at a chosen step and hook (tests/interrupting.py).
"""

import http.server
import json
import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest
import torch

from headcount.cli.errors import exit_on_config_error
from headcount.cli.train import run
from headcount.data.resumable import resumable_loader
from headcount.run_dir import RunPaths, load_model
from headcount.train.checkpointing import AtomicCheckpointIO
from headcount.train.curves import MetricsCSV

REPO = Path(__file__).resolve().parents[1]
INTERRUPTING = REPO / "tests" / "interrupting.py"
# 8 batches an epoch (256 examples, 32 a batch), validation every 16 steps, last.ckpt every 8: checkpoints at epoch
# ends, after validations, and mid-epoch on a stop. Dropout, so that the random state has to be restored too.
TRAIN = ["model=tiny", "model.dropout=0.1", "data=induction", "data.n_train=256", "data.n_val=64", "data.n_test=64"]
TRAIN += ["trainer.max_steps=48", "trainer.val_check_interval=16", "trainer.checkpoint_every_n_steps=8"]
TRAIN += [
    "trainer.log_every_n_steps=4",
    "trainer.progress_bar=false",
    "ablation=[single_head]",
    "ablation.progress=false",
]
SMOKE = ["model=tiny", "data=induction", "trainer=smoke", "data.n_train=64", "data.n_val=32", "data.n_test=32"]
EXIT = {"KILL": -signal.SIGKILL, "INT": 130, "TERM": 143}


def headcount_train(run_dir: Path, args: list[str], interrupt: tuple = ()) -> subprocess.CompletedProcess:
    """headcount-train in a subprocess on one CPU thread (bit for bit needs the same thread count every time)."""
    command = [str(INTERRUPTING), *map(str, interrupt)] if interrupt else ["-m", "headcount.cli.train"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    args = [*args, f"hydra.run.dir={run_dir}"]
    return subprocess.run(
        [sys.executable, *command, *args], capture_output=True, text=True, env=env, cwd=run_dir.parent
    )


def checkpoint_step(run_dir: Path) -> int:
    return torch.load(RunPaths(run_dir).last_ckpt, weights_only=False, mmap=True)["global_step"]


def test_runs_stopped_and_killed_anywhere_end_bit_for_bit_like_the_uninterrupted_run(compose_train, tmp_path):
    uninterrupted = tmp_path / "uninterrupted"
    run(compose_train(TRAIN), uninterrupted)  # in this process, on one thread too (conftest.py)
    rng = random.Random(10)
    chain = [
        ("on_before_optimizer_step", rng.randint(9, 14), "INT"),  # Ctrl-C mid-step: the step ends, then a checkpoint
        ("on_train_batch_start", 25, "KILL"),  # resumes from step 24, an epoch's last step
        ("on_before_optimizer_step", rng.randint(26, 30), "TERM"),  # written by a run resumed from an epoch's end
        ("on_validation_batch_end", 48, "KILL"),  # mid-validation; resumes from step 40, written by a resumed run
    ]
    run_dir = tmp_path / "run"
    for hook, step, name in chain:
        proc = headcount_train(run_dir, TRAIN, (hook, step, name))
        assert proc.returncode == EXIT[name], f"{hook} {step} {name}: {proc.stderr[-3000:]}"
        if name != "KILL":
            assert "run the same command again to resume" in proc.stderr
            stopped_at = step + 1 if hook == "on_before_optimizer_step" else step
            assert checkpoint_step(run_dir) == stopped_at, f"{name} at {hook} {step}"
    proc = headcount_train(run_dir, TRAIN)
    assert proc.returncode == 0, proc.stderr[-3000:]

    want, got = (json.loads(RunPaths(d).metrics.read_text()) for d in (uninterrupted, run_dir))
    numbers = [key for key in want if key.startswith(("val/", "test/"))]
    assert {k: got[k] for k in numbers} == {k: want[k] for k in numbers}, f"interrupted at {chain}"
    for name in ("ablation/single_head.csv", "logs/metrics.csv"):
        assert (run_dir / name).read_bytes() == (uninterrupted / name).read_bytes(), f"{name}, interrupted at {chain}"
    weights, reference = (load_model(RunPaths(d).last_ckpt).state_dict() for d in (run_dir, uninterrupted))
    assert all(torch.equal(weights[k], reference[k]) for k in reference)

    curves = pd.read_csv(run_dir / "logs" / "metrics.csv")  # every logged step once
    kinds = curves.notna().drop(columns=["epoch", "step"]).idxmax(axis=1).str.split("/").str[0]  # train, val, test
    assert not curves.assign(kind=kinds).duplicated(["step", "kind"]).any()
    assert list(curves.loc[kinds == "train", "step"]) == list(range(3, 48, 4))  # every 4th step, counted from 0
    assert list(curves.loc[kinds == "val", "step"]) == [15, 31, 47, 48]  # during training, then the final one


def test_ctrl_c_twice_exits_at_once_without_a_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    proc = headcount_train(run_dir, TRAIN, ("on_train_batch_end", 11, "INT,INT"))
    assert proc.returncode != 0 and "exiting now, without a checkpoint" in proc.stderr
    assert checkpoint_step(run_dir) == 8  # the last periodic one, none at step 11
    assert not RunPaths(run_dir).metrics.exists()


def test_damaged_last_checkpoint_is_refused_with_one_line_and_nothing_touched(compose_train, tmp_path, capsys):
    cfg = compose_train(SMOKE + ["ablation=[]"])
    run(cfg, tmp_path)
    paths = RunPaths(tmp_path)
    paths.done.unlink()
    paths.metrics.unlink()
    ckpt = paths.last_ckpt.read_bytes()
    paths.last_ckpt.write_bytes(ckpt[: len(ckpt) // 2])  # what a kill during a plain (non-atomic) write leaves
    curves = (tmp_path / "logs" / "metrics.csv").read_bytes()
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        exit_on_config_error(run)(cfg, tmp_path)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(paths.last_ckpt) in err and "delete it" in err and "best.ckpt" in err
    assert paths.last_ckpt.read_bytes() == ckpt[: len(ckpt) // 2]
    assert (tmp_path / "logs" / "metrics.csv").read_bytes() == curves
    assert not paths.metrics.exists() and not paths.done.exists()


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("killed halfway through the write")


def test_checkpoint_writes_are_atomic(tmp_path):
    path = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"step": 1, "weights": torch.ones(1000)}, path)
    with pytest.raises(RuntimeError, match="halfway"):
        io.save_checkpoint({"weights": torch.zeros(1000), "then": Unpicklable()}, path)
    assert torch.load(path, weights_only=True)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_curves_file_forgets_what_a_killed_run_logged_after_its_checkpoint(tmp_path):
    path = tmp_path / "metrics.csv"
    rows = ["epoch,step,train/loss", "0,3,2.5", "0,7,2.0", "1,11,1.5", "1,15,1.25"]
    path.write_text("\n".join(rows) + "\n1,19,1.")  # the last row cut short by the kill
    curves = MetricsCSV(str(tmp_path))
    curves.forget_from(12)  # the checkpoint the run resumes from was written at step 12
    assert path.read_text() == "\n".join(rows[:4]) + "\n"
    curves.log_metrics({"epoch": 1, "train/loss": 1.375}, step=15)
    curves.log_metrics({"epoch": 1, "val/loss": 1.5}, step=15)  # a new column: the file is rewritten
    curves.save()
    assert path.read_text().splitlines() == [
        "epoch,step,train/loss,val/loss",
        *(f"{row}," for row in rows[1:4]),
        "1,15,1.375,",
        "1,15,,1.5",
    ]


def batch_order(loader, n_batches: int) -> list[list[int]]:
    batches = iter(loader)
    return [next(batches)["x"].tolist() for _ in range(n_batches)]


@pytest.mark.parametrize("workers", [0, 2])
def test_training_loader_resumes_mid_epoch_and_at_epoch_ends_in_the_same_order(workers):
    dataset = [{"x": torch.tensor(i)} for i in range(37)]  # 7 batches of 5 an epoch, 2 examples dropped
    options = dict(num_workers=workers, persistent_workers=workers > 0)
    plain = torch.utils.data.DataLoader(
        dataset, 5, shuffle=True, drop_last=True, generator=torch.Generator().manual_seed(3), **options
    )
    order = [batch for _ in range(3) for batch in batch_order(plain, 7)]  # as Lightning reads it: 7 batches a pass
    for served in (3, 7):  # mid-epoch, and at the end of the epoch
        loader = resumable_loader(dataset, 5, seed=3, **options)
        seen = batch_order(loader, 7) + batch_order(loader, served)
        assert seen == order[: len(seen)]
        resumed = resumable_loader(dataset, 5, seed=3, **options)
        resumed.load_state_dict(loader.state_dict())
        rest = batch_order(resumed, 7 - served if served < 7 else 7)
        assert seen + rest == order[: len(seen) + len(rest)], f"resumed after {served} batches"


class NotWandb(http.server.BaseHTTPRequestHandler):
    """A server that answers, but not as W&B does."""

    def do_GET(self):
        self.send_error(404)

    do_POST = do_GET

    def log_message(self, *args):
        pass


def test_wandb_failing_at_start_falls_back_offline_in_one_line_and_trains(compose_train, tmp_path, capsys, monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotWandb)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    try:
        run(compose_train(SMOKE + ["ablation=[]", "logger=wandb", "logger.wandb.mode=online"]), tmp_path)
    finally:
        server.shutdown()
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith(("W&B", "wandb"))]
    assert len(said) == 1 and "refused the run" in said[0] and "logging offline" in said[0], said
    assert RunPaths(tmp_path).done.exists()
    assert list((tmp_path / "wandb").glob("offline-run-*"))

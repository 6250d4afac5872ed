"""Faults of the machine, not of the user: a disk that fills up while training writes a checkpoint or a scan writes its
results, a run directory or a sweep on read-only storage, a data cache that cannot be written. Each was a traceback;
each is one line now, leaves no half-written file, loses nothing, and the same command again (space freed) resumes.
Finished results are read on read-only storage as anywhere."""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from storage_helpers import SmallDisk, read_only
from sweep_helpers import SMOKE, command_in_process, one_line, smoke_run, train_in_process
from test_report import make_run

import headcount
from headcount import run_lock
from headcount.ablation import session
from headcount.cli import ablate as ablating
from headcount.cli.report import main as report_main
from headcount.run_dir import RunPaths

QUIET = ["ablation.progress=false", "trainer.progress_bar=false"]
# Checkpoints at steps 4 and 8, the best checkpoint (validation) at step 8 only: a checkpoint (580 kB) fits in 900 kB,
# a second one does not.
STEPS = ["trainer.max_steps=8", "trainer.checkpoint_every_n_steps=4", "trainer.val_check_interval=8"]


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    """small_disk(room) -> a SmallDisk at <tmp>/disk, unmounted after the test."""
    disks: list[SmallDisk] = []

    def make(room: int) -> SmallDisk:
        disks.append(SmallDisk(tmp_path / "disk", room, monkeypatch))
        return disks[-1]

    yield make
    for disk in disks:
        disk.close()


def ablate(monkeypatch, cwd: Path, args: list[str]) -> int:
    return command_in_process(ablating.main, monkeypatch, cwd, args)


def last_line(err: str) -> str:
    """The line a command ended with; no traceback before it."""
    assert "Traceback" not in err and "Logging error" not in err, err
    return err.strip().splitlines()[-1]


def half_written(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith(".tmp") or ".tmp." in p.name]


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(RunPaths(run_dir).last_ckpt, weights_only=False)["state_dict"]


def test_a_disk_full_during_a_checkpoint_is_one_line_and_the_rerun_resumes_exactly(small_disk, tmp_path, monkeypatch):
    """torch's zip writer failed with `RuntimeError ... inline_container.cc ... unexpected pos` (a traceback)."""
    disk = small_disk(900_000)
    args = [*SMOKE, *QUIET, *STEPS, "ablation=[]", "hydra.run.dir=run"]
    run_dir = disk.path / "run"
    assert train_in_process(monkeypatch, disk.path, args) == 1
    assert torch.load(RunPaths(run_dir).last_ckpt, weights_only=False, mmap=True)["global_step"] == 4
    assert not half_written(disk.path) and not RunPaths(run_dir).metrics.exists()

    disk.free()
    assert train_in_process(monkeypatch, disk.path, args) == 0
    assert RunPaths(run_dir).done.exists()
    reference = tmp_path / "reference"
    reference.mkdir()
    assert train_in_process(monkeypatch, reference, args) == 0
    ours, theirs = weights(run_dir), weights(reference / "run")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_the_line_a_full_disk_gives_during_training(small_disk, monkeypatch, capsys):
    disk = small_disk(900_000)
    args = [*SMOKE, *QUIET, *STEPS, "ablation=[]", "hydra.run.dir=run"]
    assert train_in_process(monkeypatch, disk.path, args) == 1
    line = last_line(capsys.readouterr().err)
    assert line == (
        f"error: could not write {disk.path / 'run' / 'checkpoints' / 'best.ckpt'} (No space left on device); the "
        "last checkpoint (checkpoints/last.ckpt) is intact and the run resumes from it: free space and run the same "
        "command again"
    ), line


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A smoke run trained by headcount-train (in this process), with its baseline scan."""
    return smoke_run(pytest.MonkeyPatch, tmp_path_factory.mktemp("finished"))


def test_a_disk_full_during_a_scan_is_one_line_and_the_rerun_resumes(small_disk, finished_run, monkeypatch, capsys):
    """A scan's results met `OSError: [Errno 28] No space left on device` (a traceback)."""
    disk = small_disk(4_000_000)
    run_dir = Path(shutil.copytree(finished_run, disk.path / "run"))
    summary = (run_dir / "ablation" / "summary.json").read_bytes()
    run_ablations = session.run_ablations  # headcount-ablate imports it from there when its work starts

    def disk_fills_as_the_scans_start(*args, **kwargs):
        disk.fill()
        return run_ablations(*args, **kwargs)

    args = [f"run_dir={run_dir}", "ablation=single_head", "ablation.progress=false"]
    with monkeypatch.context() as patched:
        patched.setattr(session, "run_ablations", disk_fills_as_the_scans_start)
        assert ablate(monkeypatch, disk.path, args) == 1
    line = last_line(capsys.readouterr().err)
    assert line.startswith(f"error: could not write {run_dir / 'ablation'}/") and "(No space left on device)" in line
    assert line.endswith(
        "the results saved so far (and an interrupted scan's partial sums) are intact and the scans "
        "resume: free space and run the same command again"
    ), line
    assert not half_written(run_dir) and not (run_dir / "ablation" / "single_head.csv").exists()
    assert (run_dir / "ablation" / "summary.json").read_bytes() == summary
    assert not (run_dir / run_lock.LOCK_NAME).exists()

    disk.free()
    assert ablate(monkeypatch, disk.path, args) == 0
    copy = Path(shutil.copytree(finished_run, disk.path.parent / "copy"))
    assert ablate(monkeypatch, disk.path.parent, [f"run_dir={copy}", *args[1:]]) == 0
    ours, theirs = (pd.read_csv(r / "ablation" / "single_head.csv") for r in (run_dir, copy))
    pd.testing.assert_frame_equal(ours, theirs)


def test_finished_results_are_read_on_read_only_storage(finished_run, tmp_path, monkeypatch, capsys):
    """headcount-ablate failed creating .lock (`OSError: [Errno 30]`) though every result was up to date."""
    run_dir = Path(shutil.copytree(finished_run, tmp_path / "run"))
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    with read_only(run_dir):
        assert ablate(monkeypatch, tmp_path, [f"run_dir={run_dir}", "ablation=baseline"]) == 0
        err = capsys.readouterr().err
        assert "Traceback" not in err and f"up to date: {run_dir}/ablation/baseline.csv" in err
        assert err.strip().endswith("nothing to write: every result asked for is up to date"), err
        run = headcount.load_run(run_dir)
        assert run.scan("baseline")["loss"].iloc[0] == run.results("baseline")["loss"].iloc[0]
        assert run.metrics["test/loss"] > 0

        # What is not up to date would have to be written there: one line naming the folder, before any work
        assert ablate(monkeypatch, tmp_path, [f"run_dir={run_dir}", "ablation=single_head"]) == 2
        line = one_line(capsys.readouterr().err.replace(f"up to date: {run_dir}/ablation/baseline.csv\n", ""))
        assert line == (
            f"error: run_dir='{run_dir}': is on read-only storage: scan single_head (zero mode) is not up to date "
            "there, and its results cannot be written; ablate a copy of the run on writable storage"
        ), line
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


def test_a_report_of_a_sweep_on_read_only_storage(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    for n_heads in (1, 2):
        make_run(sweep, n_heads, seed=0)
    with read_only(sweep):
        with pytest.raises(SystemExit) as exit_info:
            report_main([str(sweep)])
        assert exit_info.value.code == 2
        line = one_line(capsys.readouterr().err)
        assert line == (
            f"error: sweep_dir='{sweep}': {sweep / 'report'} cannot be written (read-only storage?): write the report "
            "elsewhere with --out DIR"
        ), line
        report_main([str(sweep), "--out", str(tmp_path / "report")])
    assert (tmp_path / "report" / "report.md").exists() and not (sweep / "report").exists()


@pytest.fixture
def text_file(tmp_path) -> Path:
    path = tmp_path / "words.txt"
    path.write_text(" ".join(f"word{i % 50}" for i in range(20_000)))
    return path


def train_on_text(monkeypatch, cwd: Path, text_file: Path, *args: str) -> int:
    data = ["data=text", f"data.path={text_file}", "data.n_train=64", "data.n_val=16", "data.n_test=16"]
    others = [a for a in SMOKE if not a.startswith("data")]
    return train_in_process(monkeypatch, cwd, [*others, *QUIET, *data, "ablation=[]", "hydra.run.dir=run", *args])


@pytest.mark.parametrize("setting", ["HEADCOUNT_CACHE", "data.cache_dir"])
def test_a_data_cache_that_is_a_file_is_one_line_naming_the_setting(setting, text_file, tmp_path, monkeypatch, capsys):
    """A FileExistsError traceback."""
    cache = tmp_path / "cache-file"
    cache.write_text("")
    (tmp_path / "work").mkdir()
    if setting == "HEADCOUNT_CACHE":
        monkeypatch.setenv("HEADCOUNT_CACHE", str(cache))
        args = []
    else:
        args = [f"data.cache_dir={cache}"]
    assert train_on_text(monkeypatch, tmp_path / "work", text_file, *args) == 2
    line = one_line(capsys.readouterr().err)
    assert line == f"error: {setting}='{cache}': is a file; the data cache needs a folder", line
    assert not list((tmp_path / "work").iterdir())


def test_a_read_only_data_cache_is_one_line_unless_it_holds_the_data(text_file, tmp_path, monkeypatch, capsys):
    """An OSError traceback (Errno 30) creating the cache entry."""
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("HEADCOUNT_CACHE", str(cache))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with read_only(cache):
        assert train_on_text(monkeypatch, tmp_path / "a", text_file) == 2
        line = last_line(capsys.readouterr().err)
        assert line == (
            f"error: HEADCOUNT_CACHE='{cache}': cannot be written (read-only storage?), and it holds no entry for "
            "this data yet; choose another folder"
        ), line
        assert not [p for p in (tmp_path / "a").rglob("*") if p.is_file()]
    # Once the entry is there, a read-only cache serves it
    assert train_on_text(monkeypatch, tmp_path / "b", text_file) == 0
    with read_only(cache):
        assert train_on_text(monkeypatch, tmp_path / "a", text_file) == 0
    assert json.loads((tmp_path / "a" / "run" / "data_fingerprint.json").read_text()) == json.loads(
        (tmp_path / "b" / "run" / "data_fingerprint.json").read_text()
    )


def test_a_read_only_cache_without_the_tiny_random_llama_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from headcount.errors import ConfigError
    from headcount.pretrained import load_pretrained

    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("HEADCOUNT_CACHE", str(cache))
    with read_only(cache), pytest.raises(ConfigError, match=r"^HEADCOUNT_CACHE='.*': .* cannot be written") as err:
        load_pretrained("headcount:tiny-random-llama")
    assert "\n" not in str(err.value)


def test_a_refused_write_outside_headcount_io_is_one_line_and_a_refused_read_is_not_taken_for_one(capsys):
    """Hydra writes its own config and log files, and the training curve is appended to: a full disk there raises a
    plain OSError, without the file's name (it was a traceback). A permission denied may have been a read: it stays
    the error it is."""
    import errno

    from headcount.cli.errors import exit_on_config_error

    def full():
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(SystemExit) as exit_info:
        exit_on_config_error(full)()
    assert exit_info.value.code == 1
    assert one_line(capsys.readouterr().err) == (
        "error: could not write a file (No space left on device); every file written before is intact (files are "
        "written whole or not at all): free space and run the same command again"
    )

    def denied():
        raise PermissionError(errno.EACCES, "Permission denied", "/some/file")

    with pytest.raises(PermissionError):
        exit_on_config_error(denied)()

"""The commands under faults: every mistake is one line naming its key, exit code 2, no traceback and no run folder;
one process at a time works in a run directory; Ctrl-C or SIGTERM stops a whole sweep, and the same command again
finishes exactly the unfinished jobs."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from sweep_helpers import SMOKE, command_in_process, one_line, run_dirs, train_in_process

from headcount import run_lock
from headcount.api import Run
from headcount.cli import ablate as ablating
from headcount.cli import preflight
from headcount.cli.errors import discarded_if_rejected
from headcount.cli.sweep_stop import descendants
from headcount.cli.train import run
from headcount.config import typed
from headcount.config.ablation import unselected_scans_dropped
from headcount.config.model import ModelConfig
from headcount.errors import ConfigError
from headcount.run_dir import RunPaths

QUIET = ["ablation.progress=false", "trainer.progress_bar=false"]


def ablate_in_process(monkeypatch, cwd: Path, args: list[str]) -> int:
    """headcount-ablate <args> in this process, from cwd; returns its exit code."""
    return command_in_process(ablating.main, monkeypatch, cwd, args)


def python_env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1] / "src")}


@contextmanager
def lock_held_by_another_process(run_dir: Path, command: str) -> Iterator[subprocess.Popen]:
    """A child process that holds run_dir's lock until the block ends (then it is killed, leaving its file)."""
    code = f"import sys; from headcount import run_lock; run_lock.acquire({str(run_dir)!r}, {command!r}); "
    code += "print('held', flush=True); sys.stdin.read()"
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=python_env()
    )
    try:
        assert child.stdout.readline().strip() == "held"
        yield child
    finally:
        child.kill()
        child.wait()


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A smoke run trained by headcount-train (in this process)."""
    root = tmp_path_factory.mktemp("finished")
    mp = pytest.MonkeyPatch()
    try:
        assert train_in_process(mp, root, [*SMOKE, *QUIET, "ablation=[baseline]", "hydra.run.dir=run"]) == 0
    finally:
        mp.undo()
    assert RunPaths(root / "run").done.exists() and not (root / "run" / run_lock.LOCK_NAME).exists()
    return root / "run"


# --- every mistake: one line, exit 2, nothing left behind ------------------------------------------------------

MISTAKES = [
    (["model.attn.n_head=4"], "model.attn.n_head=4: not a key of model.attn", "did you mean model.attn.n_heads?"),
    (["+model.attn.n_head=4"], "model.attn.n_head=4: not a key of model.attn", "did you mean model.attn.n_heads?"),
    (["+trainer.max_step=10"], "trainer.max_step=10: not a key of trainer", "did you mean trainer.max_steps?"),
    (["bogus=1"], "bogus=1: not a key of the config", "(its keys: model, data, trainer"),
    (["model=tinyy"], "model='tinyy': allowed: attn_only_2l,", "did you mean tiny?"),
    (
        ["ablation=[baseline,single_hed]"],
        "ablation='single_hed': allowed: attribution, baseline,",
        "did you mean single_head?",
    ),
    (["experiment=induction_head"], "experiment='induction_head'", "did you mean induction_heads?"),
    (["hydra/launcher=parallell"], "hydra/launcher='parallell'", "did you mean parallel?"),
    (["ablation.mode=bogus"], "ablation.mode='bogus': allowed: zero, mean, resample, patch", ""),
    (["seed=abc"], "seed='abc'", ""),
    (["model.d_model=1000000000"], "model.d_model=1000000000: the model needs more than", "of RAM"),
    (["model.d_model=32768", "model.n_layers=100"], "model.d_model=32768: a model of 1.29e+12", "GiB to train"),
    (["ablation=pairs", "ablation.scans.pairs.top_k=1"], "ablation.scans.pairs.top_k=1: must be at least 2", ""),
    (["ablation.scans.pairs.top_k=1"], "ablation.scans.pairs.top_k=1: no scan named pairs is selected", ""),
    (["ablation=custom"], "ablation.scans.custom.masks_file=None", ""),
    (["ablation=custom", "ablation.scans.custom.masks_file=/no/such.yaml"], "ablation.scans.custom.masks_file=", ""),
    (
        ["ablation=l0_gates", "ablation.scans.l0_gates.l0.target_heads=[99]"],
        "ablation.scans.l0_gates.l0.target_heads=[99]",
        "(the model's",
    ),
    (["data=text", "data.path=/no/such/file.txt"], "data.path='/no/such/file.txt'", ""),
    (
        ["model.encoder_layers=1", "model.cross_attn.n_heads=2"],
        "model.cross_attn.n_heads=2: model.cross_attn does not set n_heads here",
        "add it with ++: ++model.cross_attn.n_heads=2",
    ),
    (
        ["model.encoder_layers=1", "++model.cross_attn.n_headz=2"],
        "model.cross_attn.n_headz=2: not a key of model.cross_attn",
        "did you mean model.cross_attn.n_heads?",
    ),
    (["model.encoder_layers=1", "++model.cross_attn.combine=avg"], "model.cross_attn.combine='avg'", "concat, sum"),
    (["++model.cross_attn.n_heads=2"], "model.cross_attn='set': is the cross-attention of an encoder-decoder", ""),
]


@pytest.mark.parametrize("args, message, hint", MISTAKES, ids=[" ".join(m[0]) for m in MISTAKES])
def test_a_mistake_is_one_line_before_any_work(monkeypatch, tmp_path, capsys, args, message, hint):
    assert train_in_process(monkeypatch, tmp_path, [*SMOKE, *args]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"error: {message}") and hint in line, line
    assert not (tmp_path / "outputs").exists()  # no run folder: nothing was trained, nothing looks like a run


def test_a_model_that_fails_to_build_on_meta_is_not_called_too_large(monkeypatch, compose_train):
    """Only a size PyTorch cannot count is refused as too large; any other failure (here the one grouped-query
    attention once raised on the meta device) shows as itself, not as "needs more than 8.59e+09 GiB"."""
    cfg = compose_train(SMOKE)

    def fails(_):
        raise RuntimeError("cannot repeat_interleave a meta tensor without output_size")

    monkeypatch.setattr(preflight, "build_model", fails)
    with pytest.raises(RuntimeError, match="repeat_interleave"):
        preflight.model_on_meta(typed(cfg.model, ModelConfig), cfg.trainer)


@pytest.mark.parametrize(
    "args, message",
    [
        (["seed=0,1", "ablation=pairs", "ablation.scans.pairs.top_k=1"], "ablation.scans.pairs.top_k=1"),
        (["seed=0,1", "+trainer.max_step=10"], "trainer.max_step=10"),
        (["model.d_model=32,1000000000"], "model.d_model=1000000000"),
    ],
)
def test_a_mistake_in_any_job_stops_the_sweep_before_the_first(monkeypatch, tmp_path, capsys, args, message):
    assert train_in_process(monkeypatch, tmp_path, ["-m", *SMOKE, *args]) == 2
    line = one_line(capsys.readouterr().err)
    assert message in line and line.endswith("no job started"), line
    assert not (tmp_path / "outputs").exists()


def test_an_experiment_without_the_scans_its_finding_reads_skips_the_finding(monkeypatch, tmp_path, capsys):
    assert train_in_process(monkeypatch, tmp_path, ["experiment=induction_heads", "size=smoke", "ablation=[]"]) == 0
    err = capsys.readouterr().err
    skipped = [line for line in err.splitlines() if "skipped" in line]
    assert skipped == [
        "finding induction_heads skipped: it reads the single_head, head_scores scan results, and ablation lists "
        "only no scans"
    ], err
    (run_dir,) = (tmp_path / "outputs" / "experiments" / "induction_heads").iterdir()
    assert RunPaths(run_dir).done.exists() and not (run_dir / "findings").exists()


def test_an_experiments_settings_for_a_scan_left_out_of_the_list_run_nothing(monkeypatch, tmp_path, capsys):
    # ioi_heads gives attribution, direct_effect and top_heads settings: with `ablation=[baseline]` those entries have
    # no kind and once ran as single_head scans under the other scans' names.
    assert train_in_process(monkeypatch, tmp_path, ["experiment=ioi_heads", "size=smoke", "ablation=[baseline]"]) == 0
    (run_dir,) = (tmp_path / "outputs" / "experiments" / "ioi_heads").iterdir()
    task_dir = RunPaths(run_dir).ablation / "tasks" / "ioi"
    written = sorted(p.name for p in task_dir.rglob("*.csv")) if task_dir.exists() else []
    assert not [name for name in written if not name.startswith("baseline")], written
    assert "skipped" in capsys.readouterr().err
    table = Run(run_dir).scan("direct_effect")  # its settings in the saved config, never selected: the kind's own
    assert {"layer", "head"} <= set(table.columns) and len(table) == 8


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "error: run_dir=None: missing: headcount-ablate run_dir=<a finished training run>"),
        (["run_dir=missing"], "error: run_dir='missing': no such folder"),
        (["run_dir=empty"], "error: run_dir='empty': is not a headcount run directory"),
    ],
)
def test_ablate_without_a_run_says_so_and_creates_nothing(monkeypatch, tmp_path, capsys, args, message):
    (tmp_path / "empty").mkdir()
    assert ablate_in_process(monkeypatch, tmp_path, args) == 2
    assert one_line(capsys.readouterr().err).startswith(message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"] and not list((tmp_path / "empty").iterdir())


def test_ablate_refusing_a_setting_leaves_no_log_folder(monkeypatch, finished_run, capsys):
    logs = RunPaths(finished_run).ablation / "logs"
    before = sorted(logs.iterdir()) if logs.exists() else []
    args = [f"run_dir={finished_run}", "ablation=layer", "ablation.n_eval=0"]
    assert ablate_in_process(monkeypatch, finished_run.parent, args) == 2
    assert one_line(capsys.readouterr().err).startswith("error: ablation.n_eval=0")
    assert (sorted(logs.iterdir()) if logs.exists() else []) == before
    assert not (finished_run / run_lock.LOCK_NAME).exists()


def test_a_refused_job_folder_holding_only_hydra_files_is_removed(tmp_path):
    run_dir = tmp_path / "run"
    run_lock.acquire(run_dir, "headcount-train")
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "config.yaml").write_text("seed: 0\n")
    (run_dir / "train.log").write_text("")
    with pytest.raises(ConfigError), discarded_if_rejected(run_dir):
        raise ConfigError("data.hub_name", "nope", "no such dataset")
    assert not run_dir.exists() and not run_lock.holds(run_dir)


def test_a_mistake_in_any_job_of_an_ablate_multirun_stops_it_before_the_first(monkeypatch, finished_run, capsys):
    """`headcount-ablate -m ... ablation.mode=zero,mean,resample,patch` computed three jobs, then failed the fourth:
    patching needs a task. Every job is checked first, as headcount-train's are."""
    out = RunPaths(finished_run).ablation
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    args = ["-m", f"run_dir={finished_run}", "ablation=single_head", "ablation.mode=zero,mean,patch"]
    assert ablate_in_process(monkeypatch, finished_run.parent, [*args, "ablation.progress=false"]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("error: job 2 of 3 (") and "ablation.mode=patch" in line, line
    assert "error: job 2 of 3" in line and "ablation.mode='patch': " in line and line.endswith("; no job started")
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before  # no table, no log folder


def never_converted(source):
    raise AssertionError(f"{source} was converted before the command's input was checked")


@pytest.mark.parametrize(
    "rows, message",
    [
        (None, "error: task.path='/nonexistent.jsonl': no such file"),
        (
            [{"prompt": "When Mary and John, John gave to", "answer": " Mary", "wrong": " John"}],
            "prompt 0: the answer ' Mary' and the wrong answer ' John' both start with token 32 (' ')",
        ),
    ],
    ids=["no such file", "answers sharing a first token"],
)
def test_a_refused_pretrained_ablation_leaves_no_folder_and_converts_nothing(
    monkeypatch, tmp_path, capsys, rows, message
):
    """The command exited 2 with the right line, but left NEW/ with .hydra/, data_fingerprint.json and
    pretrained.json; a task refused for its answers was refused only after the checkpoint's conversion."""

    path = "/nonexistent.jsonl"
    if rows is not None:
        path = tmp_path / "prompts.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    monkeypatch.setattr("headcount.pretrained.run_config.cached_pretrained", never_converted)
    args = ["model=tiny_random_llama", "task=file", f"task.path={path}", "ablation=[baseline]", "run_dir=NEW"]
    assert ablate_in_process(monkeypatch, tmp_path, args) == 2
    assert message in one_line(capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if rows is None else ["prompts.jsonl"])


@pytest.mark.parametrize("own_folder", [False, True], ids=["new folder", "a folder of the user's"])
def test_a_pretrained_run_refused_after_it_was_written_leaves_only_what_was_there(
    monkeypatch, tmp_path, capsys, own_folder
):
    """A refusal that needs the weights (a baseline that overflows ablation.dtype) comes after the run's files are
    written: they go again, and what the folder held before stays."""
    if own_folder:
        (tmp_path / "NEW").mkdir()
        (tmp_path / "NEW" / "notes.txt").write_text("mine")

    def refused(cfg, run_dir):
        assert RunPaths(run_dir).pretrained.exists() and RunPaths(run_dir).config.exists()
        raise ConfigError("ablation.dtype", "float16", "the model's baseline is nan in this precision")

    monkeypatch.setattr("headcount.ablation.session.run_ablations", refused)
    args = ["model=tiny_random_llama", "ablation=[baseline]", "run_dir=NEW"]
    assert ablate_in_process(monkeypatch, tmp_path, args) == 2
    assert one_line(capsys.readouterr().err).startswith("error: ablation.dtype='float16': the model's baseline")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == (
        [Path("NEW"), Path("NEW/notes.txt")] if own_folder else []
    )


# --- one writer per run --------------------------------------------------------------------------------------


def test_a_second_process_is_refused_and_a_lock_left_behind_is_taken_over(tmp_path, capsys):
    run_dir = tmp_path / "run"
    with lock_held_by_another_process(run_dir, "headcount-train") as holder:
        with pytest.raises(ConfigError, match=rf"in use by headcount-train \(pid {holder.pid} on "):
            run_lock.acquire(run_dir, "headcount-ablate")
        with pytest.raises(ConfigError, match="in use by headcount-train"):
            run_lock.check_free(run_dir, "sweep_name", None)
    # The holder was killed: its file names it still, but the kernel has dropped its lock.
    run_lock.acquire(run_dir, "headcount-ablate")
    notice = one_line(capsys.readouterr().err)
    assert notice.startswith("notice: taking over the lock of") and f"(pid {holder.pid} on" in notice
    assert run_lock.holds(run_dir) and f'"pid": {os.getpid()}' in (run_dir / run_lock.LOCK_NAME).read_text()
    run_lock.release(run_dir)
    assert not (run_dir / run_lock.LOCK_NAME).exists()


def test_train_and_ablate_on_a_run_in_use_are_refused_and_change_nothing(monkeypatch, finished_run, capsys):
    config = RunPaths(finished_run).config.read_bytes()
    with lock_held_by_another_process(finished_run, "headcount-train") as holder:
        # A different config in the same folder: refused before Hydra writes its .hydra/ there
        args = [*SMOKE, "seed=7", f"hydra.run.dir={finished_run}"]
        assert train_in_process(monkeypatch, finished_run.parent, args) == 2
        line = one_line(capsys.readouterr().err)
        assert line.startswith("error: hydra.run.dir=") and f"in use by headcount-train (pid {holder.pid}" in line
        assert ablate_in_process(monkeypatch, finished_run.parent, [f"run_dir={finished_run}"]) == 2
        assert f"in use by headcount-train (pid {holder.pid}" in one_line(capsys.readouterr().err)
    assert RunPaths(finished_run).config.read_bytes() == config
    # The holder is gone (killed): the next command takes its lock over, says so, and works.
    assert ablate_in_process(monkeypatch, finished_run.parent, [f"run_dir={finished_run}", "ablation=baseline"]) == 0
    assert "notice: taking over the lock" in capsys.readouterr().err
    assert not (finished_run / run_lock.LOCK_NAME).exists()


def test_a_sweep_whose_run_is_in_use_starts_no_job(monkeypatch, tmp_path, capsys):
    args = ["-m", *SMOKE, "seed=0,1", "sweep_name=busy"]
    job = tmp_path / "outputs" / "multirun" / "busy" / "seed=0"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in [*SMOKE, "seed=0"]))
    with lock_held_by_another_process(job, "headcount-train") as holder:
        assert train_in_process(monkeypatch, tmp_path, args) == 2
    line = one_line(capsys.readouterr().err)
    assert f"seed=0 is in use by headcount-train (pid {holder.pid}" in line and line.endswith("no job started")
    assert not (job.parent / "seed=1").exists()


# --- sweeps stop whole ---------------------------------------------------------------------------------------


def start_sweep(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "headcount.cli.train", "-m", *args],
        cwd=cwd,
        env=python_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def is_locked(run_dir: Path) -> bool:
    try:
        run_lock.check_free(run_dir, "run", str(run_dir))
    except ConfigError:
        return True
    return False


def test_sigterm_stops_a_basic_sweep_and_the_same_command_finishes_exactly_the_rest(monkeypatch, tmp_path, capsys):
    """The basic launcher runs jobs one after another in its own process: SIGTERM during job 1 leaves job 0
    finished, job 1 unfinished and job 2 unstarted."""
    args = [*SMOKE, *QUIET, "ablation=[]", "trainer.max_steps=40", "trainer.val_check_interval=20"]
    args += ["seed=0,1,2", "sweep_name=stop"]
    sweep = tmp_path / "outputs" / "multirun" / "stop"
    proc = start_sweep(args, tmp_path)
    try:
        wait_for(lambda: is_locked(sweep / "seed=1"), 120, "job 1 to start")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    # Before job 1's first step the job stops at once; after it, at the next step boundary with a checkpoint: which
    # one depends on how fast the machine is, and both are one line that says the same command resumes.
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: stopped by SIGTERM; the same command again resumes") or re.match(
        r"stopped at step \d+: wrote .*last\.ckpt; run the same command again to resume", last
    ), last
    done = [RunPaths(run).done.exists() for run in run_dirs(sweep)]
    assert [run.name for run in run_dirs(sweep)] == ["seed=0", "seed=1"] and done == [True, False]
    finished = RunPaths(sweep / "seed=0").last_ckpt.stat().st_mtime_ns

    assert train_in_process(monkeypatch, tmp_path, ["-m", *args]) == 0
    err = capsys.readouterr().err
    assert err.count("already finished") == 1 and "compare the runs: headcount-report outputs/multirun/stop" in err
    assert [RunPaths(run).done.exists() for run in run_dirs(sweep)] == [True, True, True]
    assert RunPaths(sweep / "seed=0").last_ckpt.stat().st_mtime_ns == finished


def running(pid: int) -> bool:
    """Whether a process is alive (an ended one its new parent has not reaped yet counts as ended)."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


@pytest.mark.parametrize(
    "launcher, signum",
    [
        # slow (80 s): the basic launcher's stop is in the default suite (test_sigterm_stops_a_basic_sweep_...)
        pytest.param(["hydra/launcher=submitit_local"], signal.SIGINT, id="submitit_local", marks=pytest.mark.slow),
        pytest.param(
            ["hydra/launcher=parallel", "hydra.launcher.n_jobs=2"],
            signal.SIGTERM,
            id="parallel",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_a_signal_to_the_launcher_stops_the_jobs_it_started(tmp_path, launcher, signum):
    """submitit_local and joblib run jobs in processes of their own: the signal reaches them through the launcher,
    which ends only when they have, and the same command again finishes exactly the unfinished job."""
    args = [*launcher, *SMOKE, *QUIET, "ablation=[]", "trainer.val_check_interval=20"]
    args += ["trainer.max_steps=4,150", "sweep_name=stop"]
    sweep = tmp_path / "outputs" / "multirun" / "stop"
    short, long = sweep / "max_steps=4", sweep / "max_steps=150"
    proc = start_sweep(args, tmp_path)
    try:
        wait_for(lambda: RunPaths(short).done.exists() and is_locked(long), 240, "one job done, one training")
        jobs = descendants(proc.pid)
    finally:
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=90)
    assert proc.returncode == 128 + signum, err[-2000:]
    assert "sweep stopped: the same command again finishes the unfinished jobs" in err
    assert not [pid for pid in jobs if running(pid)]
    assert not RunPaths(long).done.exists() and not is_locked(long)
    finished = RunPaths(short).last_ckpt.stat().st_mtime_ns

    rerun = subprocess.run(
        [sys.executable, "-m", "headcount.cli.train", "-m", *args], cwd=tmp_path, env=python_env(), capture_output=True
    )
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert RunPaths(long).done.exists() and RunPaths(short).last_ckpt.stat().st_mtime_ns == finished


def test_printed_paths_keep_their_brackets(compose_train, tmp_path, capsys):
    """rich read `[...]` in a path as markup and dropped it (`already finished: .../ablation=,data=...`), and broke
    long paths across lines: a path is printed whole, to be copied."""
    run_dir = tmp_path / "ablation=[baseline,pruning],data=[x]"
    run_dir.mkdir()
    RunPaths(run_dir).done.write_text("")
    run(compose_train(SMOKE), run_dir)
    assert capsys.readouterr().err == f"already finished: {run_dir} (delete DONE to rerun)\n"


NO_GPU = "this machine has no GPU: use trainer.accelerator=cpu"
ON_CPU = "on the CPU, the number of processes: a positive integer (-1 means every GPU)"
DEVICE_MISTAKES = [
    # without a GPU: a traceback from Lightning ("No supported gpu backend found!") after the folder was made; the
    # scans of headcount-ablate ran on the CPU, silently
    (["trainer.accelerator=gpu", "trainer.devices=1"], f"trainer.accelerator='gpu': {NO_GPU}"),
    (["trainer.accelerator=cuda", "trainer.devices=1"], f"trainer.accelerator='cuda': {NO_GPU}"),
    # on the CPU: Lightning's TypeError for training, one silent process for a scan
    (["trainer.devices=-1"], f"trainer.devices=-1: {ON_CPU}"),
    # no cluster starts the second node's process: the job waited for it silently (4 minutes until stopped), and
    # SIGTERM then left the run's lock behind
    (
        ["trainer.num_nodes=2"],
        "trainer.num_nodes=2: more than one node needs a process started on each, which nothing here does",
    ),
]


@pytest.mark.skipif(torch.cuda.is_available(), reason="refusals of a machine without a GPU")
@pytest.mark.parametrize("args, message", DEVICE_MISTAKES, ids=[" ".join(m[0]) for m in DEVICE_MISTAKES])
def test_devices_this_machine_does_not_have_are_one_line(monkeypatch, finished_run, tmp_path, capsys, args, message):
    assert train_in_process(monkeypatch, tmp_path, [*SMOKE, *QUIET, *args, "hydra.run.dir=run"]) == 2
    assert one_line(capsys.readouterr().err).startswith(f"error: {message}")
    assert not (tmp_path / "run").exists()
    before = sorted(p.relative_to(finished_run) for p in finished_run.rglob("*"))
    ablate = [f"run_dir={finished_run}", "ablation=baseline", *args]
    assert command_in_process(ablating.main, monkeypatch, tmp_path, ablate) == 2
    assert one_line(capsys.readouterr().err).startswith(f"error: {message}")
    assert sorted(p.relative_to(finished_run) for p in finished_run.rglob("*")) == before


@pytest.mark.parametrize(
    "experiment", ["induction_heads", "ioi_circuit", "ioi_heads", "retrieval_heads", "voita_gates", "pretrained_heads"]
)
def test_an_ablation_list_on_the_command_line_is_the_scans_that_run(compose_train, experiment):
    # An experiment's own scans are options of its ablation list: `ablation=[baseline]` leaves them all out.
    cfg = compose_train([f"experiment={experiment}", "ablation=[baseline]"])
    unselected_scans_dropped(cfg)
    assert list(cfg.ablation.scans) == ["baseline"]

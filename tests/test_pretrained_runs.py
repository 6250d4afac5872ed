"""The run directory of a pretrained model ablated as it is (`headcount-ablate model.pretrained=...`): where it goes
when the command names one, and what the Python API says of it."""

from pathlib import Path

import pytest

pytest.importorskip("transformers")

from sweep_helpers import command_in_process, one_line  # noqa: E402

import headcount  # noqa: E402
from headcount.cli import ablate as ablating  # noqa: E402
from headcount.errors import ConfigError  # noqa: E402

PRETRAINED = ["model=tiny_random_llama", "data.n_train=64", "data.n_val=16", "data.n_test=16", "data.seq_len=32"]
QUIET = ["ablation.progress=false", "ablation=baseline"]


def ablate(monkeypatch, cwd: Path, args: list[str]) -> int:
    return command_in_process(ablating.main, monkeypatch, cwd, args)


@pytest.mark.parametrize("key", ["hydra.run.dir", "run_dir"])
def test_an_explicit_run_directory_is_where_the_run_goes(key, tmp_path, monkeypatch):
    """hydra.run.dir=<dir> was ignored: the run went to outputs/pretrained/... of the working directory."""
    (tmp_path / "work").mkdir()
    folder = tmp_path / "chosen dir"
    assert ablate(monkeypatch, tmp_path / "work", [*PRETRAINED, *QUIET, f"{key}={folder}"]) == 0
    assert (folder / "pretrained.json").exists() and (folder / "ablation" / "baseline.csv").exists()
    assert list((folder / "ablation" / "logs").iterdir())  # Hydra's own files, inside the run as always
    assert not list((tmp_path / "work").iterdir())


def test_two_different_run_directories_are_refused(tmp_path, monkeypatch, capsys):
    args = [*PRETRAINED, *QUIET, f"run_dir={tmp_path / 'a'}", f"hydra.run.dir={tmp_path / 'b'}"]
    assert ablate(monkeypatch, tmp_path, args) == 2
    line = one_line(capsys.readouterr().err)
    expected = f"error: hydra.run.dir='{tmp_path / 'b'}': names headcount-ablate's run directory, as run_dir does"
    assert line.startswith(expected), line
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_metrics_of_a_run_never_trained_say_so(tmp_path, monkeypatch):
    """load_run(...).metrics raised FileNotFoundError: such a run has no metrics.json."""
    run_dir = tmp_path / "run"
    assert ablate(monkeypatch, tmp_path, [*PRETRAINED, *QUIET, f"run_dir={run_dir}"]) == 0
    run = headcount.load_run(run_dir)
    with pytest.raises(ConfigError) as err:
        run.metrics  # noqa: B018
    message = str(err.value)
    assert message.startswith(f"run_dir='{run_dir}': has no metrics.json") and "\n" not in message
    assert "run.summary(mode)" in message
    assert run.summary("zero")["baseline_loss"] > 0


def test_opening_a_pretrained_run_in_python_is_quiet(tmp_path, monkeypatch, capfd):
    """load_run read the checkpoint again with transformers' progress bars: the Python API is as quiet as the
    commands (load_pretrained's verbose=False), unless a command was started with -v."""
    import transformers

    from headcount.pretrained import run_config

    run_dir = tmp_path / "run"
    assert ablate(monkeypatch, tmp_path, [*PRETRAINED, *QUIET, f"run_dir={run_dir}"]) == 0
    # As in a fresh Python session: no command set the environment, nothing is cached
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    monkeypatch.delenv("HEADCOUNT_VERBOSITY", raising=False)
    transformers.utils.logging.enable_progress_bar()
    run_config.cached_pretrained.cache_clear()
    capfd.readouterr()
    headcount.load_run(run_dir)
    assert capfd.readouterr() == ("", "")

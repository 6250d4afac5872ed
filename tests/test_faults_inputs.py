"""What a new user met trying the commands cold (issue #19), each once a traceback, a silent surprise or a wrong hint:
a checkpoint cut short, a model loaded for training, a config node offered as a scan, more examples asked for than a
split holds, a path Hydra cannot read unquoted, Hub data without a network."""

import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from sweep_helpers import SMOKE, command_in_process, one_line, smoke_run, train_in_process

from headcount.ablation.methods.structural import save_pruned_checkpoint
from headcount.cli import ablate as ablating
from headcount.config.model import ModelConfig
from headcount.model.transformer import Transformer
from headcount.run_dir import RunPaths, load_model

QUIET = ["ablation.progress=false", "trainer.progress_bar=false"]


def ablate_in_process(monkeypatch, cwd: Path, args: list[str]) -> int:
    return command_in_process(ablating.main, monkeypatch, cwd, args)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A smoke run trained by headcount-train (in this process), with its baseline scan."""
    return smoke_run(pytest.MonkeyPatch, tmp_path_factory.mktemp("finished"))


@pytest.fixture
def run_copy(finished_run, tmp_path) -> Path:
    return Path(shutil.copytree(finished_run, tmp_path / "run"))


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("length", [20_000, 1_000, "half"])
def test_ablate_on_a_checkpoint_cut_short_is_one_line_and_changes_nothing(length, run_copy, monkeypatch, capsys):
    """At 20,000 bytes torch's zip reader failed with `OSError: [Errno 22] Invalid argument`, at other lengths with
    a RuntimeError: each a traceback and exit code 1."""
    paths = RunPaths(run_copy)
    data = paths.last_ckpt.read_bytes()
    paths.last_ckpt.write_bytes(data[: len(data) // 2 if length == "half" else length])
    before = files_of(run_copy)
    assert ablate_in_process(monkeypatch, run_copy.parent, [f"run_dir={run_copy}", "ablation=baseline"]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"error: checkpoint='{paths.last_ckpt}': is damaged or incomplete"), line
    assert "train the run again" in line
    assert files_of(run_copy) == before


def test_load_model_gives_the_model_in_eval_mode(tmp_path):
    """load_model (named in the README for exported checkpoints) gave the model in training mode: with dropout in its
    config, two calls on the same input differed."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_layers=1, d_model=32, vocab_size=16, n_ctx=16, dropout=0.5))
    save_pruned_checkpoint(model, tmp_path / "model.ckpt", {"source": "test"})
    loaded = load_model(tmp_path / "model.ckpt")
    assert not loaded.training and not any(m.training for m in loaded.modules())
    ids = torch.arange(8)[None]
    with torch.no_grad():
        assert torch.equal(loaded(ids), loaded(ids))


def test_scan_choices_are_scan_kinds_only(run_copy, monkeypatch, capsys):
    """An internal config node (scan_schema) was offered as a scan, and choosing it failed with Hydra's
    ValidationError."""
    for scan in ["scan_schema", "bogus"]:
        assert ablate_in_process(monkeypatch, run_copy.parent, [f"run_dir={run_copy}", f"ablation={scan}"]) == 2
        line = one_line(capsys.readouterr().err)
        assert line.startswith(f"error: ablation='{scan}': allowed: attribution, baseline, custom,"), line
        assert "_schema" not in line.removeprefix(f"error: ablation='{scan}'")


def test_more_examples_than_the_split_holds_is_said_and_recorded(run_copy, monkeypatch, capsys):
    args = [f"run_dir={run_copy}", "ablation=single_head", "ablation.n_eval=100000", "ablation.progress=false"]
    assert ablate_in_process(monkeypatch, run_copy.parent, args) == 0
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if "ablation.n_eval" in line]
    assert notes == ["note: ablation.n_eval=100000 is more than the val split holds: evaluated all 32 of its examples"]
    table = pd.read_csv(RunPaths(run_copy).ablation / "single_head.csv")
    assert set(table["n_eval"]) == {32}


@pytest.mark.parametrize("folder", ["runs/café", "a)b"])
def test_a_value_hydra_cannot_read_unquoted_says_to_quote_it(folder, tmp_path, monkeypatch, capsys):
    """Hydra's lexer refuses non-ASCII and some punctuation unquoted: its message (`LexerNoViableAltException:
    hydra.run.dir=runs/café`, `mismatched input ')' expecting <EOF>`) did not say what to do."""
    assert train_in_process(monkeypatch, tmp_path, [*SMOKE, f"hydra.run.dir={folder}"]) == 2
    line = one_line(capsys.readouterr().err)
    assert line == (
        f"error: hydra.run.dir={folder!r}: Hydra cannot read this value unquoted; quote it, with the quotes passed "
        f"through the shell: 'hydra.run.dir=\"{folder}\"'"
    ), line
    assert not list(tmp_path.iterdir())
    # Quoted as the line says, it works
    assert train_in_process(monkeypatch, tmp_path, [*SMOKE, *QUIET, "ablation=[]", f'hydra.run.dir="{folder}"']) == 0
    assert RunPaths(tmp_path / folder).done.exists()


def test_hub_data_without_a_network_is_one_line(tmp_path, monkeypatch, capsys):
    """datasets raised ConnectionError ("Couldn't reach ... on the Hub") through the command (conftest keeps the
    tests offline, as a machine without a network is)."""
    args = [*(a for a in SMOKE if a != "data=induction"), "data=hub", "data.hub_name=headcount-tests/no-such-dataset"]
    assert train_in_process(monkeypatch, tmp_path, args) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("error: data.hub_name='headcount-tests/no-such-dataset': not in the local cache"), line
    assert "offline" in line
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # no run folder (its empty parents may stay)


@pytest.mark.parametrize(
    "target, reason",
    [("os.path.nope", "module os.path has no attribute nope"), ("nowhere.metric", "no module named nowhere")],
)
def test_a_target_that_does_not_import_is_one_line_saying_why(target, reason, run_copy, monkeypatch, capsys):
    """Hydra logged an ERROR line of three before ours, and a missing attribute was reported as a missing module
    ("No module named 'os.path.nope'; 'os.path' is not a package")."""
    args = [f"run_dir={run_copy}", "ablation=baseline", f"ablation.metric={{_target_:{target}}}"]
    assert ablate_in_process(monkeypatch, run_copy.parent, args) == 2
    out, err = capsys.readouterr()
    assert "ERROR" not in out and "Error" not in out, out
    assert one_line(err) == f"error: ablation.metric._target_='{target}': does not import as a function ({reason})"


def test_a_config_group_set_to_null_says_how_to_select_none(run_copy, monkeypatch, capsys):
    """`task=null` was Hydra's ValueError traceback ("Config group override must be a string or a list. Got
    NoneType"), naming neither the group nor the fix."""
    args = [f"run_dir={run_copy}", "ablation=baseline", "task=null"]
    assert ablate_in_process(monkeypatch, run_copy.parent, args) == 2
    line = one_line(capsys.readouterr().err)
    assert line == "error: task=None: a config group takes an option's name; for none, write ~task"

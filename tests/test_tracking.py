"""W&B tracking: offline by default, a quick fallback when the server does not answer, bad project names refused
up front, and an offline run that holds the curves, the ablation tables and the headline numbers."""

import json
import socket
import time
from pathlib import Path

import matplotlib
import pandas as pd
import pytest

from headcount.ablation.records.summary import read_mode_summary
from headcount.cli.errors import exit_on_config_error
from headcount.cli.train import run
from headcount.config.logger import validate_wandb_project
from headcount.errors import ConfigError
from headcount.report.tracking import log_ablation_results, summary_headline
from headcount.run_dir import RunPaths
from headcount.train.loggers import wandb_mode

matplotlib.use("Agg")

SMOKE = ["model=tiny", "data=induction", "trainer=smoke", "data.n_train=64", "data.n_val=32", "data.n_test=32"]


def wandb_records(path: Path):
    """The records of a W&B transaction log (run-<id>.wandb): LevelDB's log format, 32 KiB blocks, after a 7-byte
    W&B header. Offline runs keep their summary only here, not in files/wandb-summary.json."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    block, pos, pending = 32768, 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            yield pb.Record.FromString(pending)
            pending = b""


def logged_keys(run_file: Path, record_type: str) -> set[str]:
    keys = set()
    for record in wandb_records(run_file):
        if record.WhichOneof("record_type") == record_type:
            items = record.summary.update if record_type == "summary" else record.history.item
            keys |= {item.key or item.nested_key[0] for item in items}
    return keys


def summary_values(run_file: Path) -> dict:
    values = {}
    for record in wandb_records(run_file):
        if record.WhichOneof("record_type") == "summary":
            values |= {item.key: json.loads(item.value_json) for item in record.summary.update if item.key}
    return values


def test_offline_wandb_run_holds_curves_ablation_tables_and_summary(compose_train, tmp_path):
    import wandb

    overrides = [
        "logger=wandb",
        "trainer.log_every_n_steps=1",
        "ablation=[single_head,pruning,edge_attribution]",
        "ablation.scans.edge_attribution.exact_all=true",
        "ablation.progress=false",
    ]
    cfg = compose_train(SMOKE + overrides)
    run(cfg, tmp_path)
    assert wandb.run is None  # finished: the next job in this process starts its own run
    run_id = (tmp_path / "wandb_id.txt").read_text().strip()
    (offline_run,) = (tmp_path / "wandb").glob(f"offline-run-*-{run_id}")
    run_file = offline_run / f"run-{run_id}.wandb"

    history = logged_keys(run_file, "history")
    assert {"train/loss", "val/loss", "ablation/table/single_head", "ablation/table/pruning"} <= history
    assert {"ablation/figure/single_head", "ablation/figure/pruning", "ablation/pruning_curves_table"} <= history
    edges = {"ablation/table/edge_attribution", "ablation/table/edge_attribution_faithfulness"}
    edges |= {"ablation/table/edge_attribution_cpr"}
    assert (
        edges | {"ablation/figure/edge_attribution_faithfulness", "ablation/figure/edge_attribution_circuit"} <= history
    )
    summary = summary_values(run_file)
    expected = read_mode_summary(RunPaths(tmp_path).ablation, "zero")
    assert summary["ablation/baseline_loss"] == pytest.approx(expected["baseline_loss"])
    assert summary["ablation/most_important_head"] == expected["most_important_head"]["mask"]
    assert summary["ablation/prunable_fraction/gradient"] == expected["prunable_fraction"]["gradient"]
    assert summary["params"] == json.loads(RunPaths(tmp_path).metrics.read_text())["params"]
    circuit = expected["edge_circuits"]["edge_attribution"]["circuit_faithfulness"]
    assert summary["ablation/edge_attribution/circuit_faithfulness"] == pytest.approx(circuit)
    spearman = expected["edge_attribution"]["edge_attribution"]["eap"]["spearman"]
    assert summary["ablation/edge_attribution/eap_spearman"] == pytest.approx(spearman)
    for method in ("eap", "eap_ig", "exact", "random"):
        for area in ("cpr", "cmd"):
            mib = expected["edge_circuits"]["edge_attribution"]["mib"][method][area]
            assert summary[f"ablation/edge_attribution/{method}_{area}"] == pytest.approx(mib)
    media = offline_run / "files" / "media"
    (table_file,) = (media / "table" / "ablation" / "table").glob("single_head_*.table.json")
    table = json.loads(table_file.read_text())
    assert len(table["data"]) == 2 * 4 and "delta_loss" in table["columns"]  # one row per head of model=tiny
    assert list((media / "images" / "ablation" / "figure").glob("single_head_*.png"))

    # A resumed job (DONE gone) continues the same W&B run rather than starting another.
    RunPaths(tmp_path).done.unlink()
    run(cfg, tmp_path)
    assert len(list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))) == 2
    assert not [p for p in (tmp_path / "wandb").glob("offline-run-*") if not p.name.endswith(run_id)]


def write_ablation_folder(run_dir: Path) -> None:
    """The ablation layout the engine writes, by hand: a scan CSV and figure, pruning curves, a summary."""
    out = RunPaths(run_dir).ablation
    out.mkdir(parents=True)
    rows = [("single_head", f"L0H{h}", 0, h, "zero", 2.0 + h, 0.5, 0.1 * h, -0.01, 1) for h in range(2)]
    columns = ["scan", "mask", "layer", "head", "mode", "loss", "acc", "delta_loss", "delta_acc", "n_heads_off"]
    pd.DataFrame(rows, columns=columns).to_csv(out / "single_head.csv", index=False)
    curves = [
        (o, s, f, round(f * 2), 2.0 + f + s, 0.5, f)
        for o in ("gradient", "random")
        for s in (0, 1)
        for f in (0, 0.5, 1)
    ]
    columns = ["order", "seed", "fraction", "n_pruned", "loss", "acc", "delta_loss"]
    pd.DataFrame(curves, columns=columns).to_csv(out / "pruning.csv", index=False)
    fig = matplotlib.figure.Figure()
    fig.add_subplot().plot([0, 1])
    fig.savefig(out / "single_head.png")
    summary = {
        "baseline_loss": 2.0,
        "baseline_acc": 0.5,
        "most_important_head": {"mask": "L0H1", "layer": 0, "head": 1, "delta_loss": 0.1},
        "prunable_fraction": {"gradient": 0.5, "random": 0.0},
        "settings": {"mode": "zero"},
    }
    (out / "summary.json").write_text(json.dumps(summary))
    (out / "pairs.partial.csv").write_text("# fingerprint=x\nmask\n")  # an interrupted scan: not a result


class RecordingRun:
    """Stands in for a wandb Run: keeps what is logged."""

    def __init__(self):
        self.logged, self.summary = {}, {}

    def log(self, values: dict) -> None:
        self.logged |= values


def test_log_ablation_results_reads_the_folder_layout(tmp_path):
    import wandb

    write_ablation_folder(tmp_path)
    recording = RecordingRun()
    log_ablation_results(tmp_path, recording)
    logged = recording.logged
    assert set(logged) == {
        "ablation/table/single_head",
        "ablation/table/pruning",
        "ablation/figure/single_head",
        "ablation/pruning_curves",
    }
    assert isinstance(logged["ablation/table/single_head"], wandb.Table)
    assert isinstance(logged["ablation/figure/single_head"], wandb.Image)
    curves = logged["ablation/pruning_curves"].table.get_dataframe()
    assert set(curves["lineKey"]) == {"gradient", "random"}  # one series per order
    gradient = curves[curves["lineKey"] == "gradient"]
    assert gradient["lineVal"].tolist() == pytest.approx([2.5, 3.0, 3.5])  # mean over seeds 0 and 1
    assert recording.summary == {
        "ablation/baseline_loss": 2.0,
        "ablation/baseline_acc": 0.5,
        "ablation/prunable_fraction/gradient": 0.5,
        "ablation/prunable_fraction/random": 0.0,
        "ablation/most_important_head": "L0H1",
        "ablation/most_important_head_delta_loss": 0.1,
    }


def test_other_modes_log_under_their_mode_and_arbitrary_orders_apart(tmp_path):
    """summary.json in its per-mode layout: the run's mode (zero) is the headline, mean goes under ablation/mean/, and
    an order whose heads all scored the same is not reported as a prunable fraction."""
    write_ablation_folder(tmp_path)
    summary_path = RunPaths(tmp_path).ablation / "summary.json"
    zero = json.loads(summary_path.read_text())
    mean = {
        "baseline_loss": 2.5,
        "prunable_fraction": {"gradient": 0.0, "random": 0.25},
        "arbitrary_orders": ["gradient"],
    }
    summary_path.write_text(json.dumps({"format": 2, "modes": {"zero": zero, "mean": mean}}))
    recording = RecordingRun()
    log_ablation_results(tmp_path, recording)
    assert recording.summary["ablation/baseline_loss"] == 2.0
    assert recording.summary["ablation/prunable_fraction/gradient"] == 0.5
    assert recording.summary["ablation/mean/baseline_loss"] == 2.5
    assert recording.summary["ablation/mean/prunable_fraction_arbitrary/gradient"] == 0.0
    assert "ablation/mean/prunable_fraction/gradient" not in recording.summary
    assert summary_headline({"format": 2, "modes": {"mean": mean}}) == {}  # the zero headline of a mean-only run


def test_no_ablation_folder_logs_nothing(tmp_path):
    recording = RecordingRun()
    log_ablation_results(tmp_path, recording)
    assert recording.logged == {} and recording.summary == {}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("requested", ["auto", "online"])
def test_api_key_but_no_server_falls_back_offline_within_seconds(monkeypatch, requested):
    from rich.console import Console

    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    console = Console(record=True, width=200)
    start = time.perf_counter()
    assert wandb_mode(requested, console) == "offline"
    assert time.perf_counter() - start < 5
    said = console.export_text()
    assert "does not answer" in said and "offline" in said


def test_no_api_key_means_offline_and_wandb_mode_is_respected(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert wandb_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode("auto") == "disabled"
    assert wandb_mode("offline") == "offline"


@pytest.mark.parametrize("project", ["", "team/heads", "a\\b", "heads#1", "why?", "100%", "a:b", "x" * 129])
def test_project_names_wandb_refuses(project):
    with pytest.raises(ConfigError, match="logger.wandb.project"):
        validate_wandb_project(project)


def test_bad_project_is_one_line_and_exit_2_before_training(compose_train, tmp_path, capsys):
    cfg = compose_train(SMOKE + ["logger=wandb", "logger.wandb.project=team/heads"])
    with pytest.raises(SystemExit) as exit_info:
        exit_on_config_error(run)(cfg, tmp_path)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "logger.wandb.project='team/heads'" in err and len(err.splitlines()) == 1, err
    assert not RunPaths(tmp_path).last_ckpt.exists()

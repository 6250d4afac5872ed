"""The result address: one type derives a result's folder, file names and summary.json section, and reads them back."""

from pathlib import Path

import pytest

from headcount.ablation.records.address import ResultAddress, result_folders, run_address

RUN = Path("run/ablation")


@pytest.mark.parametrize(
    "address, section, csv",
    [
        (ResultAddress(RUN), "zero", RUN / "single_head.csv"),
        (ResultAddress(RUN, "mean"), "mean", RUN / "single_head.mean.csv"),
        (ResultAddress(RUN, "zero", "accuracy"), "zero.accuracy", RUN / "single_head.zero.accuracy.csv"),
        (
            ResultAddress(RUN, "patch", "logit_diff", "ioi"),
            "patch.logit_diff",
            RUN / "tasks" / "ioi" / "single_head.patch.logit_diff.csv",
        ),
    ],
)
def test_an_address_names_its_folder_section_and_files(address, section, csv):
    assert address.section == section
    assert address.file("single_head", ".csv") == csv
    assert address.file("head_scores", ".csv", mode_independent=True) == csv.parent / "head_scores.csv"
    assert address.summary_path == csv.parent / "summary.json"
    assert ResultAddress.from_record(RUN, address.record()) == address
    assert ResultAddress.from_section(RUN, section, address.task) == address


def test_a_variant_names_its_results_apart_and_is_recorded():
    """What issue 29's settings need (the patch direction, say): one more entry, its own files, read back."""
    denoise = ResultAddress(RUN, "patch", "logit_diff", "ioi", ("denoise",))
    assert denoise.file("single_head", ".csv").name == "single_head.patch.logit_diff.denoise.csv"
    assert ResultAddress.from_record(RUN, denoise.record()) == denoise
    assert "variant" not in ResultAddress(RUN).record()  # results without one record what they always did


def test_a_section_reads_its_recorded_address_before_its_name():
    recorded = {"address": {"mode": "patch", "metric": "logit_diff", "task": "ioi"}}
    assert ResultAddress.of_section(RUN, recorded, "anything", "") == ResultAddress(RUN, "patch", "logit_diff", "ioi")
    assert ResultAddress.of_section(RUN, {}, "mean.top1", "t") == ResultAddress(RUN, "mean", "top1", "t")


def test_a_runs_address_follows_its_config(tmp_path):
    from omegaconf import OmegaConf

    config = OmegaConf.create({"ablation": {"mode": "mean", "metric": "accuracy"}})
    assert run_address(tmp_path, config) == ResultAddress(tmp_path / "ablation", "mean", "accuracy")
    assert run_address(tmp_path, OmegaConf.create({})) == ResultAddress(tmp_path / "ablation")  # the session's defaults


def test_result_folders_are_the_runs_and_each_tasks(tmp_path):
    (tmp_path / "tasks" / "b").mkdir(parents=True)
    (tmp_path / "tasks" / "a").mkdir()
    folders = result_folders(tmp_path)
    assert [(f.task, f.folder) for f in folders] == [
        ("", tmp_path),
        ("a", tmp_path / "tasks" / "a"),
        ("b", tmp_path / "tasks" / "b"),
    ]
    assert [f.summary_path for f in folders] == [f.folder / "summary.json" for f in folders]  # the address's own

"""Scan kinds own their settings (issue 33 item 4): each kind's keys are a typed class of its own (config/scans.py,
composed before torch loads; the kind names it as its `Settings`), a key the kind does not take is refused in one line
naming the kind and what it takes (on the command line, in an experiment file or a run's config, and in the Python
API), and a session checks its settings once."""

import glob
import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf
from sweep_helpers import command_in_process, one_line, smoke_run

import headcount
from headcount.ablation.scans import KINDS
from headcount.ablation.scans.base import ScanSettings, typed_scan
from headcount.ablation.session import typed_ablation
from headcount.cli import ablate as ablating
from headcount.config import CONF_DIR
from headcount.config.ablation import unselected_scans_dropped
from headcount.errors import ConfigError

SINGLE_HEAD_REFUSAL = "not a setting of scan kind single_head, which takes none but its kind"


def composed(name: str, overrides: list[str]):
    GlobalHydra.instance().clear()
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        return compose(name, overrides=overrides)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    return smoke_run(pytest.MonkeyPatch, tmp_path_factory.mktemp("settings"))


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_every_kind_has_its_settings_class():
    """The shared bag is gone: each kind's Settings is its own ScanSettings class, the one Hydra composes the kind's
    entries by (config/scans.py), and no two kinds share one."""
    from headcount.config.scans import SETTINGS

    for kind in KINDS:
        scan = KINDS[kind]
        assert issubclass(scan.Settings, ScanSettings)
        assert scan.Settings is SETTINGS.get(kind, ScanSettings), kind
    assert set(SETTINGS) <= set(KINDS)
    assert len(set(SETTINGS.values())) == len(SETTINGS)
    import headcount.config.ablation as config

    assert not hasattr(config, "ScanConfig")


@pytest.mark.parametrize("prefix", ["", "+"])
def test_a_setting_the_kind_does_not_take_is_one_line_on_the_command_line(finished_run, tmp_path, prefix, capsys):
    """`ablation.scans.single_head.receivers=[L1H2.q]` exited 0 and read back the cached table."""
    run = Path(shutil.copytree(finished_run, tmp_path / "run"))
    before = files_of(run)
    args = [f"run_dir={run}", "ablation=single_head", f"{prefix}ablation.scans.single_head.receivers=[L1H2.q]"]
    with pytest.MonkeyPatch.context() as mp:
        assert command_in_process(ablating.main, mp, tmp_path, args) == 2
    line = one_line(capsys.readouterr().err)
    assert line == f"error: ablation.scans.single_head.receivers=['L1H2.q']: {SINGLE_HEAD_REFUSAL}", line
    assert files_of(run) == before


def test_a_misspelt_setting_names_what_the_kind_takes_and_the_closest():
    with pytest.raises(ConfigError) as error:
        typed_scan("edges", {"kind": "edge_attribution", "step": 3})
    assert str(error.value) == (
        "ablation.scans.edges.step=3: not a setting of scan kind edge_attribution, which takes steps, verify_top_k, "
        "exact_all, circuit_size, circuit_sizes, random_sets, receivers, methods, edge_pruning; did you mean "
        "ablation.scans.edges.steps?"
    )


def test_a_setting_the_kind_takes_but_its_file_does_not_list_is_taken_from_the_command_line():
    """The kind's class, not its conf/ablation/<kind>.yaml, says what it takes: the file lists no from_position, no
    l0.steps."""
    cfg = composed(
        "ablate",
        [
            "run_dir=x",
            "ablation=[position_attention,l0_gates]",
            "ablation.scans.position_attention.from_position=S2",
            "ablation.scans.l0_gates.l0.steps=3",
        ],
    )
    scans = typed_ablation(cfg.ablation).scans
    assert scans["position_attention"].from_position == "S2"
    assert scans["l0_gates"].l0.steps == 3


def test_every_experiment_composes_with_typed_settings_at_every_size():
    """conf/'s experiment files give their scans settings (`scans:`): each composes at each size and each scan's
    settings are its kind's class, with the values the files set."""
    experiments = sorted(Path(p).stem for p in glob.glob(f"{CONF_DIR}/experiment/*.yaml"))
    seen = {}
    for experiment in experiments:
        for size in ("cpu", "smoke", "gpu"):
            cfg = composed("train", [f"experiment={experiment}", f"size={size}"])
            unselected_scans_dropped(cfg)
            for name, settings in typed_ablation(cfg.ablation).scans.items():
                assert isinstance(settings, KINDS[settings.kind].Settings), (experiment, name)
                seen[experiment, size, name] = settings
    assert seen["ioi_heads", "cpu", "direct_effect"].backup_top_k == 3
    assert seen["retrieval_heads", "cpu", "top_heads"].rank_by == "retrieval_scores"
    assert seen["voita_gates", "smoke", "l0_gates"].l0.steps == 4
    assert seen["voita_gates", "smoke", "l0_gates"].l0.target_heads == [6, 12, 24, 36]
    assert seen["ioi_circuit", "cpu", "induction"].skip_unreached is True
    assert seen["ioi_circuit", "cpu", "attention_from_s2"].from_position == "S2"
    assert seen["induction_heads", "cpu", "edge_attribution"].exact_all is True


def test_a_setting_the_kind_does_not_take_in_a_config_file_is_one_line():
    """An experiment file (or a run's saved config) naming a key its scan's kind lacks."""
    section = OmegaConf.create({"scans": {"heads": {"kind": "single_head", "steps": 7}}})
    with pytest.raises(ConfigError) as error:
        typed_ablation(section)
    assert str(error.value) == f"ablation.scans.heads.steps=7: {SINGLE_HEAD_REFUSAL}"


def test_the_api_refuses_a_setting_the_kind_does_not_take(finished_run, tmp_path):
    """`run.scan("single_head", receivers=[...], steps=7)` read back the cached table."""
    run_dir = Path(shutil.copytree(finished_run, tmp_path / "run"))
    before = files_of(run_dir)
    run = headcount.load_run(run_dir, device="cpu")
    with pytest.raises(ConfigError) as error:
        run.scan("single_head", receivers=["L1H2.q"], steps=7)
    assert str(error.value) == f"ablation.scans.single_head.receivers=['L1H2.q']: {SINGLE_HEAD_REFUSAL}"
    assert files_of(run_dir) == before


def test_a_session_checks_each_scan_once(finished_run, tmp_path, monkeypatch, capsys):
    """The settings were checked by the session (session.py) and again by plan()."""
    run_dir = Path(shutil.copytree(finished_run, tmp_path / "run"))
    calls = []
    check = KINDS["pairs"].check
    monkeypatch.setattr(KINDS["pairs"], "check", classmethod(lambda cls, *a: calls.append(a) or check(*a)))
    args = [f"run_dir={run_dir}", "ablation=pairs", "ablation.scans.pairs.top_k=2", "ablation.progress=false"]
    with pytest.MonkeyPatch.context() as mp:
        assert command_in_process(ablating.main, mp, tmp_path, args) == 0
    assert len(calls) == 1


MEAN_KEY_REFUSAL = (
    "ablation.mean_per_position=True: is read by mode=mean only, and ablation.mode is zero: leave it out, or set "
    "ablation.mode=mean"
)


def test_a_key_of_another_mode_is_one_line_on_the_command_line(finished_run, tmp_path, capsys):
    """`ablation.mean_per_position=true` under mode=zero exited 0 with zero ablation's table, as if it applied."""
    run = Path(shutil.copytree(finished_run, tmp_path / "run"))
    before = files_of(run)
    args = [f"run_dir={run}", "ablation=single_head", "ablation.mode=zero", "ablation.mean_per_position=true"]
    with pytest.MonkeyPatch.context() as mp:
        assert command_in_process(ablating.main, mp, tmp_path, args) == 2
    assert one_line(capsys.readouterr().err) == f"error: {MEAN_KEY_REFUSAL}"
    assert files_of(run) == before
    args = [f"run_dir={run}", "ablation=single_head", "ablation.mode=resample", "ablation.patch_direction=denoise"]
    with pytest.MonkeyPatch.context() as mp:
        assert command_in_process(ablating.main, mp, tmp_path, args) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("error: ablation.patch_direction='denoise': is read by mode=patch only, and ablation.mode")


def test_the_api_refuses_a_key_of_another_mode_and_keeps_the_runs_own_with_its_mode(finished_run, tmp_path):
    run_dir = Path(shutil.copytree(finished_run, tmp_path / "run"))
    before = files_of(run_dir)
    run = headcount.load_run(run_dir, device="cpu")
    with pytest.raises(ConfigError) as error:
        run.evaluate({"one": ["L0H0"]}, mode="zero", mean_per_position=True)
    assert str(error.value) == MEAN_KEY_REFUSAL
    with pytest.raises(ConfigError, match="^ablation.patch_direction='denoise': is read by mode=patch only"):
        run.evaluate({"one": ["L0H0"]}, mode="resample", patch_direction="denoise")
    assert files_of(run_dir) == before
    # a run whose own settings are mean per position: another mode asked for leaves that key behind, unrefused
    run.settings.mode, run.settings.mean_per_position = "mean", True
    assert run.mode_settings("zero").mean_per_position is False
    assert run.mode_settings(None).mean_per_position is True

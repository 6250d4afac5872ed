"""Low-precision scans (ablation.dtype): bfloat16 or float16 weights and activations, metrics read in float32 and
summed in float64, the dtype recorded with the results, the memory budget counting it. On a smoke-trained tiny model
(seconds)."""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from headcount.ablation.engine.evaluator import MaskEvaluator
from headcount.cli.ablate import ablate, typed_ablation_keys
from headcount.cli.errors import BAD_INPUT, as_config_error
from headcount.cli.train import run
from headcount.config import CONF_DIR
from headcount.errors import ConfigError
from headcount.run_dir import RunPaths, load_model

SMOKE = ["model=tiny", "data=induction", "trainer=smoke", "logger=none", "ablation.progress=false"]
SMOKE += ["data.n_train=64", "data.n_val=24", "data.n_test=16", "data.seq_len=32", "ablation=[]"]


def compose_config(name: str, overrides: list[str]):
    GlobalHydra.instance().clear()
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        return compose(name, overrides=overrides)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    cfg = compose_config("train", SMOKE)
    run(cfg, run_dir)
    RunPaths(run_dir).config.parent.mkdir(exist_ok=True)
    OmegaConf.save(cfg, RunPaths(run_dir).config)
    return run_dir


def ablate_with(run_dir: Path, *overrides: str) -> None:
    overrides = [f"run_dir={run_dir}", "ablation.progress=false", *overrides]
    try:
        cfg = compose_config("ablate", overrides)
    except BAD_INPUT as e:  # a value outside a choice is refused at compose time, as headcount-ablate reports it
        raise as_config_error(e) from e
    ablate(cfg, typed_ablation_keys(overrides))


def single_head(run_dir: Path, dtype: str = "float32") -> tuple[pd.DataFrame, dict]:
    out = RunPaths(run_dir).ablation
    name = "single_head.csv" if dtype == "float32" else f"single_head.zero.{dtype}.csv"
    return pd.read_csv(out / name), json.loads((out / "summary.json").read_text())


def test_a_low_precision_scan_records_its_dtype_and_stays_near_float32(trained_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    ablate_with(run_dir, "ablation=single_head")
    f32, summary32 = single_head(run_dir)
    assert "dtype" not in f32.columns  # float32, the default, records nothing new: earlier results stay up to date
    for dtype, tolerance in (("bfloat16", 0.05), ("float16", 0.01)):
        ablate_with(run_dir, "ablation=single_head", f"ablation.dtype={dtype}")
        low, summary = single_head(run_dir, dtype)
        assert (low["dtype"] == dtype).all() and low["mask"].tolist() == f32["mask"].tolist()
        section = summary["modes"][f"zero.{dtype}"]
        assert section["settings"]["dtype"] == dtype and "dtype" not in summary32["modes"]["zero"]["settings"]
        # another fingerprint: a float32 result is never read back as this one's, nor this one as float32's
        assert section["fingerprint"] != summary32["modes"]["zero"]["fingerprint"]
        # the same deltas up to the precision's rounding (a loss near 4, bfloat16 keeps 8 bits of mantissa)
        assert (low["delta_loss"] - f32["delta_loss"]).abs().max() < tolerance, dtype
        assert (low["delta_loss"] != f32["delta_loss"]).any()  # really computed in another precision
        assert low["loss"].map(lambda v: len(repr(v))).max() > 8  # sums in float64: not bfloat16's few digits


def test_a_low_precision_scan_keeps_the_float32_tables_and_the_float32_scan_keeps_its(trained_run, tmp_path):
    """ablation.dtype=bfloat16 wrote single_head.csv over the float32 table (summary.json kept only its headline
    under `superseded`), float16 then over bfloat16's: a precision comparison needs every one. The dtype is in the
    result's address, float32 keeping the plain names; a mode-independent result (head_scores) too."""
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    out = RunPaths(run_dir).ablation
    ablate_with(run_dir, "ablation=[single_head,head_scores]", "ablation.dtype=bfloat16")
    ablate_with(run_dir, "ablation=[single_head,head_scores]")
    ablate_with(run_dir, "ablation=[single_head,head_scores]", "ablation.dtype=float16")
    tables = {dtype: single_head(run_dir, dtype)[0] for dtype in ("float32", "bfloat16", "float16")}
    assert "dtype" not in tables["float32"] and (tables["bfloat16"]["dtype"] == "bfloat16").all()
    assert (tables["float16"]["dtype"] == "float16").all()
    assert {p.name for p in out.glob("head_scores*.csv")} == {
        "head_scores.csv",
        "head_scores.bfloat16.csv",
        "head_scores.float16.csv",
    }
    summary = json.loads((out / "summary.json").read_text())
    assert {"zero", "zero.bfloat16", "zero.float16"} <= set(summary["modes"])
    assert "superseded" not in summary
    for section in ("zero", "zero.bfloat16", "zero.float16"):
        assert "single_head" in summary["modes"][section]["scans"]
    shared = summary["mode_independent"]["scans"]
    assert {"head_scores", "head_scores.bfloat16", "head_scores.float16"} <= set(shared)
    # each reads back as up to date: nothing is computed again
    before = {p.name: p.read_bytes() for p in out.glob("*.csv")}
    ablate_with(run_dir, "ablation=[single_head,head_scores]", "ablation.dtype=bfloat16")
    assert {p.name: p.read_bytes() for p in out.glob("*.csv")} == before


def test_a_dtype_outside_the_choices_is_one_line(trained_run):
    with pytest.raises(ConfigError, match="ablation.dtype") as err:
        ablate_with(trained_run, "ablation=single_head", "ablation.dtype=float8")
    assert "\n" not in str(err.value) and "bfloat16" in str(err.value)


def test_the_memory_budget_counts_the_dtype(trained_run):
    """Half the bytes per float: twice the masks in one pass within the same budget."""
    model = load_model(RunPaths(trained_run).last_ckpt).eval()
    batches = [{"input_ids": torch.zeros(8, 32, dtype=torch.long), "loss_mask": torch.ones(8, 32, dtype=torch.bool)}]
    budget = 2**22
    f32 = MaskEvaluator(model, batches, memory_budget=budget).masks_per_pass
    bf16 = MaskEvaluator(model.to(torch.bfloat16), batches, memory_budget=budget).masks_per_pass
    assert f32 > 1 and bf16 in (2 * f32, 2 * f32 + 1)


def test_a_precision_the_activations_overflow_is_refused_in_one_line(trained_run, tmp_path, monkeypatch):
    """Gemma-3-270M's activations overflow float16 (its scan gave NaN, docs/BENCHMARKS.md): here a model whose
    embeddings are scaled past float16's range. Refused before any table is written; float32 measures it."""
    from headcount.model.transformer import Transformer

    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    embed = Transformer.embed
    monkeypatch.setattr(Transformer, "embed", lambda self, ids: embed(self, ids) * 1e6)
    with pytest.raises(ConfigError, match="ablation.dtype='float16': the model's baseline is (nan|inf)") as err:
        ablate_with(run_dir, "ablation=single_head", "ablation.dtype=float16")
    assert "\n" not in str(err.value) and not (RunPaths(run_dir).ablation / "single_head.csv").exists()
    ablate_with(run_dir, "ablation=single_head")
    assert (RunPaths(run_dir).ablation / "single_head.csv").exists()


@pytest.mark.parametrize("slowdown, said", [(12.0, True), (1.5, False)])
def test_a_precision_this_cpu_emulates_is_said_before_the_first_pass(
    trained_run, tmp_path, monkeypatch, capsys, slowdown, said
):
    """float16 on a CPU without half-precision arithmetic: a scan of Gemma-3-270M printed nothing for 400 s. One line
    now comes before any pass, with the measured slowdown (here set, to decide both ways on any CPU); a CPU that has
    the arithmetic says nothing."""
    from headcount.ablation import precision

    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    monkeypatch.setattr(precision, "cpu_slowdown", lambda dtype: slowdown)
    before_first_pass = []

    def first_pass(self):
        before_first_pass.append(capsys.readouterr().err)
        raise RuntimeError("the first pass")

    monkeypatch.setattr(MaskEvaluator, "baseline", first_pass)
    with pytest.raises(RuntimeError, match="the first pass"):
        ablate_with(run_dir, "ablation=single_head", "ablation.dtype=float16")
    notes = [line for line in before_first_pass[0].splitlines() if "ablation.dtype=float16" in line]
    assert notes == (
        [
            "note: ablation.dtype=float16: this CPU has no fast float16 arithmetic (a 256x256 matrix product took 12 "
            "times as long as in float32, measured now), so this scan takes about that much longer than in float32; "
            "ablation.dtype=float32 runs at full speed here"
        ]
        if said
        else []
    )


def test_the_slowdown_is_measured_for_a_low_precision_on_a_cpu_only(monkeypatch):
    from headcount.ablation import precision
    from headcount.config.ablation import AblationConfig

    threads = torch.get_num_threads()
    measured = precision.note_slow_precision(AblationConfig(dtype="float16"), torch.device("cpu"))
    assert 0 < measured < float("inf") and torch.get_num_threads() == threads  # measured in one thread, then restored
    monkeypatch.setattr(precision, "cpu_slowdown", lambda dtype: pytest.fail("measured"))
    assert precision.note_slow_precision(AblationConfig(), torch.device("cpu")) is None  # float32
    assert precision.note_slow_precision(AblationConfig(dtype="bfloat16"), torch.device("cuda")) is None

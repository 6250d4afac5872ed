"""Training end to end: configs compose, loss falls, the run directory contract holds, bad input fails early."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from headcount.ablation.records.address import ResultAddress
from headcount.cli.errors import exit_on_config_error
from headcount.cli.train import ablation_headline, run
from headcount.config import CONF_DIR, validate_train_config
from headcount.data.examples import to_batches
from headcount.metrics import masked_loss_and_accuracy
from headcount.run_dir import RunPaths, load_model, load_run
from headcount.train.job import train
from headcount.train.quiet import VERBOSITY_ENV, take_verbosity_flags, verbosity

REPO = Path(__file__).resolve().parents[1]
SMOKE = ["model=tiny", "data=induction", "trainer=smoke", "data.n_train=64", "data.n_val=32", "data.n_test=32"]


# Options that only make sense together: the translation models and the translation data (their vocabulary and
# sequence length, a source column for the encoder-decoder), each composed with its partner.
PARTNERS = {
    "model=nmt_encdec": ["data=translation_seq2seq"],
    "model=nmt_small": ["data=translation"],
    "data=translation": ["model=nmt_small"],
    "data=translation_seq2seq": ["model=nmt_encdec"],
}


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))


@pytest.mark.parametrize(
    "override",
    [f"{g}={o}" for g in ("model", "data", "trainer", "logger", "ablation") for o in group_options(g)],
)
def test_every_config_group_option_composes(compose_train, override):
    cfg = compose_train([override, *PARTNERS.get(override, [])])
    assert cfg.model.n_layers >= 1
    # Data sources with required inputs (a text path, a hub name) validate only once those are given.
    if override not in ("data=text", "data=hub"):
        validate_train_config(cfg)


def test_misspelt_key_fails_at_compose_time(compose_train):
    with pytest.raises(Exception, match="n_head"):
        compose_train(["model.attn.n_head=3"])


def test_wrong_type_fails_at_compose_time(compose_train):
    with pytest.raises(Exception, match="n_heads"):
        compose_train(["model.attn.n_heads=many"])


def test_short_training_run_lowers_the_loss(compose_train, tmp_path):
    cfg = compose_train(
        [
            "model=tiny",
            "data=induction",
            "trainer.max_steps=80",
            "trainer.val_check_interval=80",
            "trainer.progress_bar=false",
        ]
    )
    metrics = train(cfg, tmp_path)
    log = pd.read_csv(tmp_path / "logs" / "metrics.csv")
    losses = log["train/loss"].dropna().to_numpy()
    assert losses[-5:].mean() < losses[:5].mean() - 0.3
    assert metrics["val/loss"] < math.log(256) - 1  # well below the uniform guess over the model's vocabulary
    assert RunPaths(tmp_path).last_ckpt.exists()
    assert (tmp_path / "checkpoints" / "best.ckpt").exists()


def test_same_seed_same_numbers_bit_for_bit(compose_train, tmp_path):
    cfg = compose_train(SMOKE + ["trainer.max_steps=6", "trainer.val_check_interval=6"])
    results = []
    for name in ("a", "b"):
        metrics = train(cfg, tmp_path / name)
        model = load_model(tmp_path / name / "checkpoints" / "last.ckpt")
        results.append((metrics, model.state_dict()))
    (m1, s1), (m2, s2) = results
    assert all(m1[k] == m2[k] for k in m1 if "loss" in k or "acc" in k)
    assert all(torch.equal(s1[k], s2[k]) for k in s1)


def test_interrupted_run_resumes_from_last_checkpoint(compose_train, tmp_path):
    first = compose_train(SMOKE + ["trainer.max_steps=4", "trainer.val_check_interval=2"])
    train(first, tmp_path)
    resumed = compose_train(SMOKE + ["trainer.max_steps=8", "trainer.val_check_interval=2"])
    metrics = train(resumed, tmp_path)
    assert metrics["steps"] == 8


def test_run_writes_the_run_directory_contract_through_the_cli(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "train.py"), *SMOKE, f"hydra.run.dir={run_dir}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    paths = RunPaths(run_dir)
    assert paths.config.exists() and paths.last_ckpt.exists() and paths.done.exists()
    metrics = json.loads(paths.metrics.read_text())
    assert {"val/loss", "val/acc", "test/loss", "test/acc", "params", "flops_per_token"} <= metrics.keys()
    assert not (tmp_path / "outputs").exists()  # nothing written outside the run directory


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.attn.n_heads=0"], "model.attn.n_heads=0"),
        (["model.attn.n_heads=3"], "model.attn.n_heads=3"),
        (["model.attn.combine=mean"], "model.attn.combine='mean'"),
        (["data.seq_len=100", "model.n_ctx=64"], "data.seq_len=100"),
        (["data=pystdlib", "model.vocab_size=64"], "model.vocab_size=64"),
        (["data=text", "data.path=/no/such/file.txt"], "data.path='/no/such/file.txt'"),
        (["trainer.precision=fp8"], "trainer.precision='fp8'"),
        (["trainer.val_check_interval=0"], "trainer.val_check_interval=0"),
        (["trainer.checkpoint_every_n_steps=0"], "trainer.checkpoint_every_n_steps=0"),
        (["trainer.max_steps=-5"], "trainer.max_steps=-5"),
        (["trainer.log_every_n_steps=-1"], "trainer.log_every_n_steps=-1"),
        (["trainer.limit_val_batches=-1"], "trainer.limit_val_batches=-1"),
        (["trainer.optim.lr=0"], "trainer.optim.lr=0"),
        (["trainer.optim.beta2=1.5"], "trainer.optim.beta2=1.5"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_with_nothing_finished(compose_train, tmp_path, capsys, overrides, message):
    # A value outside a choice is refused when the config is composed, the rest when the run starts.
    with pytest.raises(SystemExit) as exit_info:
        exit_on_config_error(lambda: run(compose_train(SMOKE + overrides), tmp_path))()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not RunPaths(tmp_path).done.exists() and not RunPaths(tmp_path).metrics.exists()


def test_cli_exit_code_for_bad_input(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "headcount.cli.train", "model.attn.n_heads=0", f"hydra.run.dir={tmp_path / 'r'}"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "model.attn.n_heads=0" in proc.stderr


def test_nan_loss_stops_and_names_the_step(compose_train, tmp_path, capsys, monkeypatch):
    import headcount.train.module as training

    real = training.masked_loss_and_accuracy
    calls = {"n": 0}

    def poisoned(logits, ids, mask):
        loss, acc = real(logits, ids, mask)
        if torch.is_grad_enabled():  # count training steps only, not validation
            calls["n"] += 1
        return (loss * float("nan"), acc) if calls["n"] >= 3 else (loss, acc)

    monkeypatch.setattr(training, "masked_loss_and_accuracy", poisoned)
    cfg = compose_train(SMOKE + ["trainer.val_check_interval=100", "trainer.max_steps=10"])
    with pytest.raises(SystemExit) as exit_info:
        exit_on_config_error(run)(cfg, tmp_path)
    assert exit_info.value.code != 0
    err = capsys.readouterr().err
    assert "at step 2" in err
    assert not RunPaths(tmp_path).done.exists()


def test_val_and_test_loss_are_per_token_as_the_ablation_baseline(compose_train, tmp_path):
    """40 validation examples in batches of 32 and 8: a mean of the batches' means would weight the 8 like the 32."""
    overrides = ["data.n_val=40", "ablation=[baseline]", "ablation.split=val", "ablation.progress=false"]
    cfg = compose_train(SMOKE + overrides)
    run(cfg, tmp_path)
    metrics = json.loads(RunPaths(tmp_path).metrics.read_text())
    baseline = json.loads((RunPaths(tmp_path).ablation / "summary.json").read_text())["modes"]["zero"]
    assert metrics["val/loss"] == pytest.approx(baseline["baseline_loss"], rel=1e-6, abs=0)
    assert metrics["val/acc"] == pytest.approx(baseline["baseline_acc"], rel=1e-6, abs=0)

    finished = load_run(tmp_path, cfg)
    with torch.no_grad():
        batch_means = [
            masked_loss_and_accuracy(finished.model(b["input_ids"]), b["input_ids"], b["loss_mask"])[0].item()
            for b in to_batches(finished.examples("val", None, "split"), 32, torch.device("cpu"))
        ]
    assert len(batch_means) == 2 and abs(sum(batch_means) / 2 - metrics["val/loss"]) > 1e-4  # the test can tell


def test_a_run_prints_no_third_party_noise_unless_asked_with_v(tmp_path):
    def stderr_of(*flags: str) -> str:
        run_dir = tmp_path / f"run{''.join(flags)}"
        args = [*flags, *SMOKE, "ablation=[]", "trainer.progress_bar=true", f"hydra.run.dir={run_dir}"]
        command = [sys.executable, str(REPO / "scripts" / "train.py"), *args]
        proc = subprocess.run(command, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stderr

    quiet = stderr_of()
    for noise in ("Tip", "srun", "LeafSpec", "Epoch 0/-2", "Total FLOPs", "GPU available", "Trainer.fit"):
        assert noise not in quiet, quiet
    assert "trained 4 steps" in quiet and "per target token" in quiet
    # The bar counts steps, shows the latest losses and the time left (its last frame, off a terminal).
    assert re.search(r"step 4/4 train/loss \d+\.\d{4}  val/loss \d+\.\d{4} \d+:\d\d:\d\d", quiet), quiet
    assert "GPU available" in stderr_of("-v")  # Lightning's own output is back


def test_building_a_text_cache_shows_no_datasets_bars(tmp_path):
    """datasets is imported with the commands, before the verbosity is read: its bars are switched off there too."""
    text = tmp_path / "corpus.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 400)
    data = ["data=text", f"data.path={text}", f"data.cache_dir={tmp_path / 'cache'}"]
    args = [*SMOKE, *data, "ablation=[]", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "train.py"), *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "cache").is_dir()  # the cache was built in this run
    for bar in ("Generating", "Saving the dataset", "examples/s"):
        assert bar not in proc.stderr, proc.stderr


def test_verbosity_flags_leave_the_command_line_before_hydra_reads_it(monkeypatch):
    monkeypatch.delenv(VERBOSITY_ENV, raising=False)
    assert take_verbosity_flags(["model=tiny", "-m", "seed=0,1"]) == ["model=tiny", "-m", "seed=0,1"]
    assert verbosity() == 0
    assert take_verbosity_flags(["-vv", "model=tiny"]) == ["model=tiny"] and verbosity() == 2


def test_the_end_of_run_summary_reads_the_runs_own_mode_from_summary_json():
    """summary.json holds one section per mode (format 2): the summary line reads the run's, not the file's top."""
    zero = {
        "settings": {"mode": "zero", "split": "val", "n_eval": 32},
        "baseline_loss": 5.25,
        "scans": {"single_head": {}, "pruning": {}},
        "most_important_head": {"mask": "L1H3", "delta_loss": 0.125},
        "prunable_fraction": {"gradient": 0.25, "random": 0.5},
        "arbitrary_orders": ["gradient"],
    }
    mean = {"settings": {"mode": "mean", "split": "test", "n_eval": 8}, "baseline_loss": 5.5, "scans": {"layer": {}}}
    summary = {"format": 2, "modes": {"zero": zero, "mean": mean}, "mode_independent": {"scans": {"head_scores": {}}}}
    assert ablation_headline(summary, ResultAddress(Path("ablation"), "zero")) == (
        "single_head, pruning, head_scores (zero ablation, 32 val examples); baseline loss 5.2500; "
        "most important head L1H3 (loss +0.1250 without it); "
        "prunable 25% by gradient (arbitrary order), 50% by random"
    )
    assert ablation_headline(summary, ResultAddress(Path("ablation"), "mean")).startswith(
        "layer, head_scores (mean ablation, 8 test examples)"
    )
    assert ablation_headline({"format": 2, "modes": {}}, ResultAddress(Path("ablation"))) is None


def test_a_toy_model_trains_with_the_family_features_and_its_checkpoint_rebuilds_them(compose_train, tmp_path):
    features = ["model.positions=rotary", "model.norm=rmsnorm_plus_one", "model.mlp_act=geglu_tanh"]
    features += ["model.sliding_window=3", "model.layer_types=[sliding,full]", "model.qk_norm=head"]
    features += ["model.post_norm=true", "model.embed_scale=true", "model.attn.softcap=20", "model.final_softcap=30"]
    features += ["model.rotary_theta_local=100", "model.rope_scaling.type=linear", "model.rope_scaling.factor=2"]
    cfg = compose_train(SMOKE + features + ["trainer.max_steps=4", "trainer.val_check_interval=4"])
    metrics = train(cfg, tmp_path)
    assert math.isfinite(metrics["val/loss"])
    model = load_model(tmp_path / "checkpoints" / "last.ckpt").eval()
    assert (model.cfg.sliding_window, model.cfg.layer_types, model.cfg.rope_scaling.type) == (
        3,
        ["sliding", "full"],
        "linear",
    )
    assert model.blocks[0].attn.q_norm is not None and model.lm_head.softcap == 30.0

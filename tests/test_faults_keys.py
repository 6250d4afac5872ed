"""Keys that were accepted and should not be (issue 34): values a model cannot run with (a yarn ramp that divides by
zero, an infinite cap or scale), a number read as true, and keys the model never reads. Each is one line naming the
key, its value and what is allowed, at the config check, before any run folder exists."""

import math

import pytest
from sweep_helpers import SMOKE, command_in_process, one_line, train_in_process

from headcount.cli import ablate as ablating
from headcount.config.model import AttentionConfig, ModelConfig, RopeScalingConfig
from headcount.errors import ConfigError
from headcount.model.transformer import Transformer

YARN = ["model.positions=rotary", "model.rope_scaling.type=yarn"]


@pytest.mark.parametrize(
    "overrides, line",
    [
        (  # a ZeroDivisionError in rotary.py, the run folder left
            [*YARN, "model.rope_scaling.beta_fast=0"],
            "model.rope_scaling.beta_fast=0.0: must be a finite number of at least model.rope_scaling.beta_slow=1.0 "
            "(yarn's ramp bounds, in rotations over original_n_ctx)",
        ),
        (
            [*YARN, "model.rope_scaling.beta_slow=0"],
            "model.rope_scaling.beta_slow=0.0: must be a finite number above 0 (yarn's ramp bounds, in rotations over "
            "original_n_ctx)",
        ),
        (
            [*YARN, "model.rope_scaling.beta_fast=0.5"],
            "model.rope_scaling.beta_fast=0.5: must be a finite number of at least model.rope_scaling.beta_slow=1.0",
        ),
        (
            [*YARN, "model.rope_scaling.beta_fast=inf"],
            "model.rope_scaling.beta_fast=inf: must be a finite number of at least",
        ),
        (
            [*YARN, "model.rotary_theta=1"],
            "model.rotary_theta=1.0: must be above 1 with model.rope_scaling.type=yarn (its ramp divides by "
            "ln(rotary_theta))",
        ),
        # each passed the `> 0` check, and training stopped with "training loss is nan at step 0"
        (["model.attn.softcap=inf"], "model.attn.softcap=inf: must be a finite number above 0 or null"),
        (["model.final_softcap=inf"], "model.final_softcap=inf: must be a finite number above 0 or null"),
        (
            ["model.attn.query_pre_attn_scalar=inf"],
            "model.attn.query_pre_attn_scalar=inf: must be a finite number above 0 or null",
        ),
        (["model.attn.softcap=nan"], "model.attn.softcap=nan: must be a finite number above 0 or null"),
        (["model.norm_eps=inf"], "model.norm_eps=inf: must be a finite number above 0"),
        (["model.positions=rotary", "model.rotary_theta=inf"], "model.rotary_theta=inf: must be a finite number"),
        # read as true
        (["model.embed_scale=2"], "model.embed_scale=2: must be true or false"),
        (["model.embed_scale=yes"], "model.embed_scale='yes': must be true or false"),
        (["trainer.deterministic=0"], "trainer.deterministic=0: must be true or false"),
        # accepted and never read
        (
            ["model.rotary_theta_local=100"],
            "model.rotary_theta_local=100.0: is the rotary base of sliding layers, and this model has "
            "model.positions=learned: leave it unset, or use rotary positions and model.sliding_window",
        ),
        (
            ["model.positions=rotary", "model.rotary_theta_local=100"],
            "model.rotary_theta_local=100.0: is the rotary base of sliding layers, and this model has no sliding "
            "layer:",
        ),
        (
            ["model.sliding_window=4", "model.layer_types=[full,full]"],
            "model.sliding_window=4: is not used: model.layer_types marks no layer sliding",
        ),
        (
            ["model.positions=rotary", "model.rope_scaling.factor=4"],
            "model.rope_scaling.factor=4.0: is not used with model.rope_scaling.type=default; leave "
            "model.rope_scaling.factor unset or change that setting",
        ),
        (
            [*YARN, "model.rope_scaling.low_freq_factor=2"],
            "model.rope_scaling.low_freq_factor=2.0: is not used with model.rope_scaling.type=yarn",
        ),
        (["model.rotary_theta=500"], "model.rotary_theta=500.0: is not used with model.positions=learned"),
        (["model.mlp=false", "model.mlp_act=swiglu"], "model.mlp_act='swiglu': is not used with model.mlp=false"),
    ],
)
def test_a_key_the_model_cannot_use_is_one_line_and_leaves_no_run_folder(
    overrides, line, monkeypatch, tmp_path, capsys
):
    assert train_in_process(monkeypatch, tmp_path, [*SMOKE, *overrides, "hydra.run.dir=NEW"]) == 2
    said = one_line(capsys.readouterr().err)
    assert said.startswith(f"error: {line}"), said
    assert not (tmp_path / "NEW").exists() and not list(tmp_path.iterdir())


def test_a_sweep_with_a_number_for_a_true_false_key_fails_before_any_job(monkeypatch, tmp_path, capsys):
    assert train_in_process(monkeypatch, tmp_path, ["-m", *SMOKE, "model.embed_scale=true,2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: job 1 of 2 (") and len(err.splitlines()) == 1, err
    assert err.endswith(" model.embed_scale=2): model.embed_scale=2: must be true or false; no job started"), err
    assert not (tmp_path / "outputs").exists()


def test_headcount_ablate_refuses_a_number_for_a_true_false_key_before_preparing_the_run(monkeypatch, tmp_path, capsys):
    """Checked before the pretrained run is prepared: no run is written (Hydra's log folder under NEW/ablation/logs,
    made before any check can run, is the commands' own matter: cli/)."""
    args = ["model=tiny_random_llama", "ablation=[baseline]", "ablation.allow_data_change=1", "run_dir=NEW"]
    assert command_in_process(ablating.main, monkeypatch, tmp_path, args) == 2
    assert one_line(capsys.readouterr().err) == "error: ablation.allow_data_change=1: must be true or false"
    assert not [p for p in (tmp_path / "NEW").glob("*") if p.name != "ablation"]  # no config, pretrained.json, data


@pytest.mark.parametrize(
    "settings, line",
    [
        ({"embed_scale": 2}, "model.embed_scale=2: must be true or false"),
        ({"attn": AttentionConfig(n_heads=4, qkv_bias=1)}, "model.attn.qkv_bias=1: must be true or false"),
        (
            {"positions": "rotary", "rope_scaling": RopeScalingConfig(type="yarn", truncate="no")},
            "model.rope_scaling.truncate='no': must be true or false",
        ),
        ({"final_softcap": math.inf}, "model.final_softcap=inf: must be a finite number above 0 or null"),
    ],
)
def test_a_config_built_in_python_is_checked_alike(settings, line):
    with pytest.raises(ConfigError) as err:
        Transformer(ModelConfig(d_model=32, **{"attn": AttentionConfig(n_heads=4), **settings}))
    assert str(err.value) == line


def test_yarn_with_equal_ramp_bounds_builds_as_transformers_allows():
    """transformers warns only when beta_fast < beta_slow; equal bounds make the ramp one step (its 0.001 guard)."""
    scaling = RopeScalingConfig(type="yarn", factor=4.0, original_n_ctx=8, beta_fast=2.0, beta_slow=2.0)
    Transformer(ModelConfig(d_model=32, attn=AttentionConfig(n_heads=4), positions="rotary", rope_scaling=scaling))


@pytest.mark.parametrize(
    "overrides, line",
    [
        # trainer: infinite or NaN rates passed `> 0` or failed no `< 0` check
        (["trainer.optim.lr=inf"], "trainer.optim.lr=inf: must be a finite number above 0"),
        (["trainer.optim.weight_decay=nan"], "trainer.optim.weight_decay=nan: must be a finite number, 0 or more"),
        (["trainer.optim.grad_clip=inf"], "trainer.optim.grad_clip=inf: must be a finite number, 0 or more"),
        # a float above 1 is a number of batches to Lightning, which failed inside the run on one that is not whole
        (
            ["trainer.limit_val_batches=2.5"],
            "trainer.limit_val_batches=2.5: must be a share of the validation batches in [0, 1] (0: no validation) or "
            "a whole number of them",
        ),
        (["trainer.limit_val_batches=nan"], "trainer.limit_val_batches=nan: must be a share"),
        (["trainer.compile=1"], "trainer.compile=1: must be true or false"),
        # data: keys another source reads, accepted and ignored
        (
            ["data.n_pairs=4"],
            "data.n_pairs=4: is read only by data.source=assoc_recall, not induction: leave it unset",
        ),
        (["data.offset_b=5"], "data.offset_b=5: is read only by data.source=offset_diff, not induction"),
        (["data.path=corpus.txt"], "data.path='corpus.txt': is read only by data.source=text, not induction"),
        (
            ["data.val_fraction=0.2"],
            "data.val_fraction=0.2: is read only by data.source=text or pystdlib or essays or hub, not induction",
        ),
        (
            ["data=text", "data.path=corpus.txt", "data.vocab_size=100"],
            "data.vocab_size=100: is read only by data.source=induction or assoc_recall or offset_diff or copy or "
            "translation or translation_seq2seq, not text",
        ),
        (["data.add_bos=1"], "data.add_bos=1: must be true or false"),
        # ablation: an infinite tolerance made every head prunable; L0 gates' stretch at infinity is NaN
        (
            ["ablation=[pruning]", "ablation.pruning.tolerance=inf"],
            "ablation.pruning.tolerance=inf: must be a finite number, 0 or more",
        ),
        (
            ["ablation=[l0_gates]", "ablation.scans.l0_gates.l0.zeta=inf"],
            "ablation.scans.l0_gates.l0.zeta=inf: must be a finite number above 1",
        ),
        (
            ["ablation=[l0_gates]", "ablation.scans.l0_gates.l0.log_alpha_init=nan"],
            "ablation.scans.l0_gates.l0.log_alpha_init=nan: must be a finite number",
        ),
        (["ablation.progress=2"], "ablation.progress=2: must be true or false"),
    ],
)
def test_other_sections_refuse_the_same_faults_in_one_line(overrides, line, monkeypatch, tmp_path, capsys):
    assert train_in_process(monkeypatch, tmp_path, [*SMOKE, *overrides, "hydra.run.dir=NEW"]) == 2
    said = one_line(capsys.readouterr().err)
    assert said.startswith(f"error: {line}"), said
    assert not (tmp_path / "NEW").exists()


@pytest.mark.parametrize(
    "check, section, line",
    [
        ("data", {"add_bos": 2}, "data.add_bos=2: must be true or false or null"),
        ("trainer", {"compile": 1}, "trainer.compile=1: must be true or false"),
        ("ablation", {"allow_data_change": "yes"}, "ablation.allow_data_change='yes': must be true or false"),
    ],
)
def test_true_false_fields_of_other_sections_built_in_python_are_checked(check, section, line):
    from headcount.config.ablation import AblationConfig, validate_ablation_config
    from headcount.config.data import DataConfig, validate_data_section
    from headcount.config.train import TrainerConfig, validate_trainer_config

    kind, validate = {
        "data": (DataConfig, validate_data_section),
        "trainer": (TrainerConfig, validate_trainer_config),
        "ablation": (AblationConfig, validate_ablation_config),
    }[check]
    with pytest.raises(ConfigError) as err:
        validate(kind(**section))
    assert str(err.value) == line

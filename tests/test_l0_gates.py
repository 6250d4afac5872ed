"""L0 head gates on a tiny random model whose data it generated itself, so that every head shapes the loss."""

from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from headcount.ablation.engine.modes import clean_z
from headcount.ablation.methods.l0_gates import (
    deterministic_gates,
    expected_open,
    l0_gates_table,
    sample_gates,
    train_l0_gates,
)
from headcount.ablation.methods.structural import prune_heads
from headcount.config.ablation import KEY, L0GatesConfig, l0_targets, validate_l0_config
from headcount.errors import ConfigError
from headcount.metrics import masked_loss_and_accuracy
from headcount.model import AttentionConfig, ModelConfig, Transformer
from headcount.model.intervention import gated

L, H, VOCAB, T = 2, 3, 16, 8
CONF_FILE = Path(__file__).resolve().parents[1] / "conf" / "ablation" / "l0_gates.yaml"


@pytest.fixture(scope="module")
def model() -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=L, d_model=24, n_ctx=T, vocab_size=VOCAB, attn=AttentionConfig(n_heads=H), mlp=False)
    model = Transformer(cfg).eval()
    with torch.no_grad():  # larger weights than the init's: a random model that relies on every head
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return model


@pytest.fixture(scope="module")
def batches(model) -> list[dict]:
    """Sequences sampled from the model itself: the full model is the best predictor of them, so heads matter."""
    g = torch.Generator().manual_seed(1)
    out = []
    with torch.no_grad():
        for _ in range(2):
            idx_BT = torch.randint(0, VOCAB, (16, 1), generator=g)
            for _ in range(T - 1):
                next_B1 = torch.multinomial(model(idx_BT)[:, -1].softmax(-1), 1, generator=g)
                idx_BT = torch.cat([idx_BT, next_B1], dim=1)
            out.append({"input_ids": idx_BT, "loss_mask": torch.ones(16, T, dtype=torch.bool)})
    return out


def evaluator(model, batches):
    """evaluate(masks_MLH) -> dict(loss=(M,), acc=(M,)), one forward pass per mask and batch."""

    @torch.no_grad()
    def evaluate(masks_MLH):
        loss_M, acc_M = torch.zeros(len(masks_MLH)), torch.zeros(len(masks_MLH))
        for m, mask_LH in enumerate(masks_MLH):
            for batch in batches:
                logits = model(batch["input_ids"], gated(mask_LH))
                loss, acc = masked_loss_and_accuracy(logits, batch["input_ids"], batch["loss_mask"])
                loss_M[m] += loss / len(batches)
                acc_M[m] += acc / len(batches)
        return {"loss": loss_M, "acc": acc_M}

    return evaluate


def test_hard_concrete_samples_lie_in_unit_interval_and_hit_both_ends():
    cfg = L0GatesConfig()
    log_alpha_LH = torch.tensor([[-1.0, 0.0, 1.0]])
    gates_NLH = sample_gates(log_alpha_LH, 20_000, cfg, torch.Generator().manual_seed(0))
    assert gates_NLH.shape == (20_000, 1, 3)
    assert gates_NLH.min() >= 0 and gates_NLH.max() <= 1
    assert ((gates_NLH == 0).float().mean(0) > 0.05).all() and ((gates_NLH == 1).float().mean(0) > 0.05).all()
    assert ((gates_NLH > 0) & (gates_NLH < 1)).any()
    test_time_gate = deterministic_gates(torch.tensor([-10.0, 0.0, 10.0]), cfg)
    torch.testing.assert_close(test_time_gate, torch.tensor([0.0, 0.5, 1.0]))


@pytest.mark.parametrize(("beta", "gamma", "zeta"), [(2 / 3, -0.1, 1.1), (0.3, -0.5, 1.2)])
def test_expected_open_is_the_probability_that_a_gate_is_nonzero(beta, gamma, zeta):
    cfg = L0GatesConfig(beta=beta, gamma=gamma, zeta=zeta)
    log_alpha_LH = torch.linspace(-3, 3, 7, dtype=torch.float64).view(1, 7)
    gates_NLH = sample_gates(log_alpha_LH, 100_000, cfg, torch.Generator().manual_seed(0))
    monte_carlo_LH = (gates_NLH > 0).double().mean(0)
    torch.testing.assert_close(expected_open(log_alpha_LH, cfg), monte_carlo_LH, rtol=0, atol=0.006)


def test_huge_penalty_closes_every_head_and_no_penalty_keeps_them(model, batches):
    closed = train_l0_gates(model, batches, L0GatesConfig(steps=80, penalty=100.0), None, progress=False)
    assert closed.n_kept == 0 and not closed.keep_LH.any()
    assert (closed.gate_LH == 0).all()
    kept = train_l0_gates(model, batches, L0GatesConfig(steps=80, penalty=0.0), None, progress=False)
    assert kept.n_kept == L * H and kept.keep_LH.all()
    assert kept.history[-1]["task_loss"] < closed.history[-1]["task_loss"]
    assert [row["penalty_weight"] for row in closed.history] == [100.0] * 80


@pytest.mark.parametrize("target", [1, 3, 5])
def test_a_target_ends_within_one_head_of_it(model, batches, target):
    result = train_l0_gates(model, batches, L0GatesConfig(steps=300, penalty=None), target, progress=False)
    assert abs(result.n_kept - target) <= 1
    assert result.target_heads == target
    assert abs(result.history[-1]["expected_l0"] - target) < 0.5
    assert result.history[-1]["target"] == target and result.history[0]["target"] > L * H - 1


def test_same_seed_same_gates_other_seed_other_gates(model, batches):
    cfg = L0GatesConfig(steps=15, penalty=0.3, seed=3)
    first, again = (train_l0_gates(model, batches, cfg, 2, progress=progress) for progress in (True, False))
    torch.testing.assert_close(first.log_alpha, again.log_alpha, rtol=0, atol=0)
    assert first.history == again.history
    other = train_l0_gates(model, batches, L0GatesConfig(steps=15, penalty=0.3, seed=4), 2, progress=False)
    assert not torch.equal(first.log_alpha, other.log_alpha)


def test_model_weights_flags_and_mode_come_back_as_they_were(model, batches):
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    model.train()
    model.lm_head.weight.requires_grad_(False)
    try:
        train_l0_gates(model, batches, L0GatesConfig(steps=5), None, progress=False)
        assert model.training
        assert not model.lm_head.weight.requires_grad
        assert all(p.requires_grad for name, p in model.named_parameters() if name != "lm_head.weight")
        assert all(p.grad is None for p in model.parameters())
        assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())
    finally:
        model.eval().lm_head.weight.requires_grad_(True)


def test_heads_a_pruned_model_lacks_stay_off_and_uncounted(model, batches):
    remove_LH = torch.tensor([[False, True, True], [False, False, True]])
    pruned = prune_heads(model, remove_LH)  # heads per layer [1, 2]: slots (0, 1) and (1, 2) do not exist
    result = train_l0_gates(pruned, batches, L0GatesConfig(steps=30, penalty=0.0), None, progress=False)
    assert result.log_alpha.shape == (L, 2) and result.n_kept == 3
    assert result.keep_LH.tolist() == [[True, False], [True, True]]
    assert result.log_alpha[0, 1] == float("-inf") and result.gate_LH[0, 1] == 0
    assert result.history[0]["expected_l0"] == pytest.approx(3 * expected_open(torch.tensor(3.0), L0GatesConfig()))
    with pytest.raises(ConfigError, match="target_heads"):
        train_l0_gates(pruned, batches, L0GatesConfig(steps=1), 4, progress=False)
    table = l0_gates_table([result], evaluator(pruned, batches))
    assert sorted(zip(table["layer"], table["head"])) == [(0, 0), (1, 0), (1, 1)]


def test_mean_like_replacements_blend_the_gates_toward_them(model, batches):
    """Replacing each head by its own clean z makes closing it free, so a small penalty closes every head; under zero
    ablation the same penalty keeps the heads the task needs."""
    one_batch = batches[:1]
    own_z = [z_BTHD.detach() for z_BTHD in clean_z(model, one_batch[0]["input_ids"])]
    cfg = L0GatesConfig(steps=80, penalty=0.05)
    free = train_l0_gates(model, one_batch, cfg, None, replacements=own_z, progress=False)
    assert free.n_kept == 0
    assert train_l0_gates(model, one_batch, cfg, None, progress=False).n_kept > 0


def test_table_has_one_row_per_run_and_head_with_the_exact_mask_loss(model, batches):
    cfg = L0GatesConfig(steps=40, penalty=0.3)
    results = [train_l0_gates(model, batches, cfg, target, progress=False) for target in (None, 2)]
    evaluate = evaluator(model, batches)
    table = l0_gates_table(results, evaluate)
    assert len(table) == 2 * L * H
    expected_columns = {"target_heads", "n_kept", "penalty_weight", "layer", "head", "kept", "log_alpha", "gate"}
    assert expected_columns | {"loss", "acc"} <= set(table.columns)
    for m, result in enumerate(results):
        run = table.iloc[m * L * H : (m + 1) * L * H]
        exact = evaluate(result.keep_LH.float()[None])
        assert run["loss"].tolist() == pytest.approx([float(exact["loss"][0])] * L * H)
        assert run["kept"].sum() == result.n_kept


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("steps", 0),
        ("lr", 0.0),
        ("n_batches", 0),
        ("beta", 0.0),
        ("gamma", 0.0),
        ("zeta", 1.0),
        ("penalty", -1.0),
        ("penalty_lr", -0.1),
        ("target_warmup", 1.5),
        ("target_heads", []),
        ("target_heads", [2, -1]),
    ],
)
def test_config_errors_name_the_key(field, value):
    with pytest.raises(ConfigError) as error:
        validate_l0_config(L0GatesConfig(**{field: value}))
    assert error.value.key == f"{KEY}.{field}"
    assert "\n" not in str(error.value)


def test_config_needs_a_penalty_or_a_target_that_fits_the_model(model, batches):
    with pytest.raises(ConfigError) as error:
        validate_l0_config(L0GatesConfig(penalty=None, target_heads=None))
    assert error.value.key == f"{KEY}.penalty"
    with pytest.raises(ConfigError) as error:
        validate_l0_config(L0GatesConfig(target_heads=[2, L * H + 1]), n_heads=L * H)
    assert error.value.key == f"{KEY}.target_heads"
    with pytest.raises(ConfigError) as error:
        train_l0_gates(model, batches, L0GatesConfig(penalty=None), None, progress=False)
    assert error.value.key == f"{KEY}.penalty"
    with pytest.raises(ConfigError) as error:
        train_l0_gates(model, batches, L0GatesConfig(), L * H + 1, progress=False)
    assert error.value.key == f"{KEY}.target_heads"


def test_scan_config_file_fills_the_dataclass():
    assert CONF_FILE.read_text().splitlines()[0] == "# @package ablation.scans.l0_gates"
    scan = yaml.safe_load(CONF_FILE.read_text())
    assert scan["kind"] == "l0_gates"
    # The file holds only what differs from the dataclass: the L0 settings are its defaults.
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(L0GatesConfig), scan.get("l0", {})))
    validate_l0_config(cfg)
    assert cfg.beta == pytest.approx(2 / 3) and (cfg.gamma, cfg.zeta) == (-0.1, 1.1)
    for targets, runs in ((None, [None]), (3, [3]), ([1, 2], [1, 2])):
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(L0GatesConfig), {"target_heads": targets}))
        assert l0_targets(cfg) == runs

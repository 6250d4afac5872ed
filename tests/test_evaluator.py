"""The fast evaluator against the definition: one plain forward pass per mask, for every mode and every scan kind."""

import pytest
import torch

from headcount.ablation.engine.evaluator import MaskEvaluator, MaskTotals
from headcount.ablation.engine.masks import (
    HeadMask,
    all_heads,
    baseline_masks,
    layer_masks,
    leave_one_in_masks,
    masks_to_gates,
    pair_masks,
    single_head_masks,
)
from headcount.ablation.engine.modes import Mean, Replacements, Resample, Zero, mean_z
from headcount.ablation.records import distributed, resumable
from headcount.ablation.records.results import fingerprint
from headcount.ablation.records.resumable import load_partial
from headcount.metrics import token_nll_and_correct
from headcount.model import AttentionConfig, ModelConfig, Transformer
from headcount.model.intervention import gated, reads
from headcount.model.memory import CPU_MEMORY_BUDGET, default_memory_budget

TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
LOSS = ("loss", "acc")  # the loss metric's columns
MODES = ["zero", "mean", "mean_per_position", "resample"]
HEADS_PER_LAYER = [4, 3, 4]  # uneven, as after structural pruning


def make_model(dtype=torch.float64, combine="concat", mlp=True) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(
        n_layers=3,
        d_model=16,
        n_ctx=12,
        vocab_size=20,
        attn=AttentionConfig(n_heads=4, combine=combine),
        mlp=mlp,
        heads_per_layer=HEADS_PER_LAYER,
    )
    return Transformer(cfg).to(dtype).eval()


def make_batches(n_batches=2, B=5, T=10, seed=1) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n_batches):
        loss_mask = torch.rand(B, T, generator=g) > 0.4
        loss_mask[0] = False  # an example with no targets at all
        batches.append(
            {
                "input_ids": torch.randint(0, 20, (B, T), generator=g),
                "loss_mask": loss_mask,
                "source_ids": torch.randint(0, 20, (B, T), generator=g),
            }
        )
    return batches


def scan_kind_masks(kind: str) -> list[HeadMask]:
    hpl = HEADS_PER_LAYER
    if kind == "pruning":  # random 0/1 masks over several layers, as pruning curves make
        g = torch.Generator().manual_seed(3)
        return [
            HeadMask(f"m{i}", tuple(h for h in all_heads(hpl) if torch.rand(1, generator=g) < 0.4)) for i in range(6)
        ]
    return {
        "baseline": baseline_masks(),
        "single_head": single_head_masks(hpl),
        "layer": layer_masks(hpl),
        "leave_one_in": leave_one_in_masks(hpl),
        "pairs": pair_masks(all_heads(hpl)),
        "custom": [HeadMask("a", ((0, 1), (2, 3))), HeadMask("b", ((1, 2),)), HeadMask("none", ())],
    }[kind]


def make_replacements(mode: str, model: Transformer) -> Replacements:
    if mode == "zero":
        return Replacements(Zero())
    if mode == "resample":
        return Replacements(Resample())
    device = next(model.parameters()).device
    reference = [{k: v.to(device) for k, v in b.items()} for b in make_batches(n_batches=2, B=4, seed=7)]
    return Replacements(Mean(), mean_z(model, reference, per_position=mode == "mean_per_position"))


def reference_replacements(mode: str, model: Transformer, batch: dict) -> list | None:
    """The replacements straight from the definition, independent of replacements.py."""
    if mode == "zero":
        return None
    if mode == "resample":
        cache = reads(["attn.z"], range(model.n_layers))
        model(batch["source_ids"], cache)
        return [cache.read("attn.z", layer) for layer in range(model.n_layers)]
    reference = make_batches(n_batches=2, B=4, seed=7)
    caches = [reads(["attn.z"], range(model.n_layers)) for _ in reference]
    for cache, ref in zip(caches, reference):
        model(ref["input_ids"], cache)
    z_per_layer = [torch.cat([c.read("attn.z", layer) for c in caches]) for layer in range(model.n_layers)]
    if mode == "mean_per_position":
        return [z.mean(0)[: batch["input_ids"].shape[1]] for z in z_per_layer]
    return [z.mean((0, 1)) for z in z_per_layer]


@torch.no_grad()
def per_mask_loop(model, batches, gates_MLH, mode) -> tuple[torch.Tensor, torch.Tensor]:
    """One plain forward pass per mask and batch."""
    losses, accs = [], []
    for gates_LH in gates_MLH:
        nll = correct = count = 0.0
        for batch in batches:
            logits = model(batch["input_ids"], gated(gates_LH, reference_replacements(mode, model, batch)))
            nll_BS, correct_BS = token_nll_and_correct(logits, batch["input_ids"])
            target_BS = batch["loss_mask"][:, 1:]
            nll += float(nll_BS[target_BS].double().sum())
            correct += float(correct_BS[target_BS].double().sum())
            count += int(target_BS.sum())
        losses.append(nll / count)
        accs.append(correct / count)
    return torch.tensor(losses, dtype=torch.float64), torch.tensor(accs, dtype=torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["baseline", "single_head", "layer", "leave_one_in", "pairs", "custom", "pruning"])
def test_evaluator_equals_one_forward_per_mask(kind, mode, dtype):
    model, batches = make_model(dtype), make_batches()
    gates_MLH = masks_to_gates(scan_kind_masks(kind), HEADS_PER_LAYER, dtype)
    result = MaskEvaluator(model, batches, make_replacements(mode, model)).evaluate(gates_MLH)
    loss, acc = per_mask_loop(model, batches, gates_MLH, mode)
    torch.testing.assert_close(result["loss"], loss, rtol=0, atol=TOL[dtype])
    torch.testing.assert_close(result["acc"], acc, rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("combine, mlp", [("sum", True), ("concat", False)])
@pytest.mark.parametrize("mode", ["zero", "resample"])
def test_evaluator_exact_for_summed_heads_and_attention_only_models(combine, mlp, mode):
    model, batches = make_model(torch.float64, combine, mlp), make_batches()
    gates_MLH = masks_to_gates(single_head_masks(HEADS_PER_LAYER) + layer_masks(HEADS_PER_LAYER), HEADS_PER_LAYER)
    result = MaskEvaluator(model, batches, make_replacements(mode, model)).evaluate(gates_MLH.double())
    loss, _ = per_mask_loop(model, batches, gates_MLH.double(), mode)
    torch.testing.assert_close(result["loss"], loss, rtol=0, atol=1e-10)


@pytest.mark.parametrize("mode", MODES)
def test_reuse_switches_and_pass_sizes_give_the_same_numbers(mode):
    model, batches = make_model(torch.float64), make_batches()
    masks = single_head_masks(HEADS_PER_LAYER) + pair_masks(all_heads(HEADS_PER_LAYER))[:20] + baseline_masks()
    gates_MLH = masks_to_gates(masks, HEADS_PER_LAYER, torch.float64)
    replacements = make_replacements(mode, model)
    variants = {
        "default": {},
        "no prefix cache": {"prefix_cache": False},
        "no clean attention": {"clean_attention": False},
        "no reuse": {"prefix_cache": False, "clean_attention": False},
        "1 mask per pass": {"masks_per_pass": 1},
        "3 masks per pass": {"masks_per_pass": 3},
        "all masks in one pass": {"masks_per_pass": len(masks)},
        "batches split to fit": {"memory_budget": 1},
    }
    results = {
        name: MaskEvaluator(model, batches, replacements, **kw).evaluate(gates_MLH) for name, kw in variants.items()
    }
    for name, result in results.items():
        torch.testing.assert_close(result["loss"], results["default"]["loss"], rtol=0, atol=1e-12, msg=name)
        torch.testing.assert_close(result["acc"], results["default"]["acc"], rtol=0, atol=1e-12, msg=name)


def test_memory_budget_sets_pass_and_batch_sizes():
    model, batches = make_model(torch.float32), make_batches(B=5)
    assert MaskEvaluator(model, batches, memory_budget=1).batch_size == 1
    roomy = MaskEvaluator(model, batches, memory_budget=2**30)
    assert roomy.batch_size == 5 and roomy.masks_per_pass > 100
    assert MaskEvaluator(model, batches, masks_per_pass=2).batch_size == 5


def test_cpu_memory_budget_is_never_smaller_than_the_weights():
    """A model with a large vocabulary (SmolLM2: 49152) would otherwise get passes of one mask of one example."""
    small = make_model(torch.float32)
    assert default_memory_budget(small) == CPU_MEMORY_BUDGET
    cfg = ModelConfig(n_layers=1, d_model=64, n_ctx=8, vocab_size=2**18, attn=AttentionConfig(n_heads=2))
    wide = Transformer(cfg).eval()
    weight_bytes = 4 * wide.num_params()
    assert weight_bytes > CPU_MEMORY_BUDGET and default_memory_budget(wide) == weight_bytes
    batches = [{"input_ids": torch.zeros(4, 8, dtype=torch.long), "loss_mask": torch.ones(4, 8, dtype=torch.bool)}]
    assert MaskEvaluator(wide, batches).batch_size == 4 and MaskEvaluator(wide, batches).masks_per_pass > 1


def test_baseline_is_the_plain_model():
    model, batches = make_model(torch.float64), make_batches()
    baseline = MaskEvaluator(model, batches).baseline()
    loss, acc = per_mask_loop(model, batches, torch.ones(1, 3, 4, dtype=torch.float64), "zero")
    assert abs(baseline["loss"] - float(loss[0])) < 1e-12 and abs(baseline["acc"] - float(acc[0])) < 1e-12
    assert baseline["n_targets"] == sum(int(b["loss_mask"][:, 1:].sum()) for b in batches)


def test_masks_touching_nothing_reuse_the_clean_pass(monkeypatch):
    model, batches = make_model(torch.float64), make_batches()
    evaluator = MaskEvaluator(model, batches)
    monkeypatch.setattr(model, "forward_layers", counting(model.forward_layers, calls := []))
    evaluator.evaluate(masks_to_gates(baseline_masks() * 3, HEADS_PER_LAYER))
    assert len(calls) == len(batches)  # the clean passes only


def counting(fn, calls: list):
    def wrapped(*args, **kwargs):
        calls.append(args)
        return fn(*args, **kwargs)

    return wrapped


def test_interrupted_scan_resumes_without_redoing_done_masks(tmp_path, monkeypatch):
    model, batches = make_model(torch.float64), make_batches(n_batches=3)
    masks = single_head_masks(HEADS_PER_LAYER)
    partial = tmp_path / "scan.partial.csv"
    monkeypatch.setattr(resumable, "SAVE_INTERVAL_S", 0.0)
    complete = distributed.evaluate_resumably(
        MaskEvaluator(model, batches, masks_per_pass=2), masks, partial, "k", "x", False
    )
    partial.unlink()

    evaluator = MaskEvaluator(model, batches, masks_per_pass=2)
    real_pass, done_sizes = evaluator.masked_pass, []

    def failing_pass(clean, gates_PLH, start, position_P):
        if len(done_sizes) == 4:
            raise KeyboardInterrupt
        done_sizes.append(len(gates_PLH))
        return real_pass(clean, gates_PLH, start, position_P)

    monkeypatch.setattr(evaluator, "masked_pass", failing_pass)
    with pytest.raises(KeyboardInterrupt):
        distributed.evaluate_resumably(evaluator, masks, partial, "k", "x", False)
    key = fingerprint("k", [(m.name, m.heads_off) for m in masks], evaluator.batch_size, len(evaluator.batches))
    saved = load_partial(partial, key, masks, LOSS)
    assert int(saved.batches_done.sum()) == sum(done_sizes)  # every pass before the interruption is saved

    resumed = MaskEvaluator(model, batches, masks_per_pass=2)
    monkeypatch.setattr(resumed, "masked_pass", counting(resumed.masked_pass, calls := []))
    totals = distributed.evaluate_resumably(resumed, masks, partial, "k", "x", False)
    n_masks_run = sum(len(args[1]) for args in calls)
    assert n_masks_run == len(masks) * len(batches) - sum(done_sizes)
    for field in ("batches_done", "sums", "n_targets"):
        assert torch.equal(getattr(totals, field), getattr(complete, field)), field


def test_partial_file_from_other_settings_is_ignored(tmp_path, monkeypatch):
    model, batches = make_model(torch.float64), make_batches()
    masks = single_head_masks(HEADS_PER_LAYER)
    partial = tmp_path / "scan.partial.csv"
    monkeypatch.setattr(resumable, "SAVE_INTERVAL_S", 0.0)
    first = distributed.evaluate_resumably(MaskEvaluator(model, batches), masks, partial, "mode=zero", "x", False)
    key = fingerprint("mode=mean", [(m.name, m.heads_off) for m in masks], 5, 2)
    assert load_partial(partial, key, masks, LOSS) is None
    again = distributed.evaluate_resumably(MaskEvaluator(model, batches), masks, partial, "mode=mean", "x", False)
    assert torch.equal(first.sums, again.sums)


def test_totals_add_up_per_mask():
    totals = MaskTotals.empty(3, LOSS)
    totals.add(torch.tensor([0, 2]), torch.tensor([[1.0, 1.0], [3.0, 0.0]]), 4)
    assert totals.batches_done.tolist() == [1, 0, 1]
    assert totals.value("loss")[0] == 0.25 and totals.value("acc")[2] == 0.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", MODES)
def test_evaluator_on_cuda_matches_the_cpu_loop(mode):
    model, batches = make_model(torch.float32), make_batches()
    gates_MLH = masks_to_gates(single_head_masks(HEADS_PER_LAYER) + layer_masks(HEADS_PER_LAYER), HEADS_PER_LAYER)
    loss, _ = per_mask_loop(model, batches, gates_MLH, mode)
    cuda_model = model.cuda()
    cuda_batches = [{k: v.cuda() for k, v in b.items()} for b in batches]
    result = MaskEvaluator(cuda_model, cuda_batches, make_replacements(mode, cuda_model)).evaluate(gates_MLH)
    torch.testing.assert_close(result["loss"].cpu(), loss, rtol=0, atol=1e-5)

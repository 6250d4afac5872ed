"""The kv_groups scan on an encoder-decoder (ablation/scans/kv_groups.py): each kind's key/value groups with that
kind's own group sizes, named by kind (enc.L0KV1, cross.L1KV0); a group's row equals masking its heads together
(float64: the same bits), EncoderDecoder's forward with the group's gates by kind, a hand ablation through torch hooks
on the attention's output projection and the structurally pruned model without the group's key/value head; groups of
one head are single_head's masks with single_head's numbers; the table has `kind` and `kv_head` and its figure a
panel per kind. The configurable models here have groups per kind: T5, BART and Marian have no grouped-query attention
(tests/seq2seq_helpers.py's families), so no converted checkpoint has groups to scan."""

import pandas as pd
import pytest
import torch
from seq2seq_cases import pairs, randomised, tiny_seq2seq

from headcount.ablation.engine.masks import masks_to_gates, requested_masks, single_head_masks
from headcount.ablation.engine.seq2seq_evaluator import Seq2SeqEvaluator
from headcount.ablation.scans import KINDS
from headcount.ablation.scans.kv_groups import model_kv_group_masks
from headcount.config.model import AttentionConfig, ModelConfig
from headcount.data.examples import to_batches
from headcount.model.encoder_decoder import EncoderDecoder, gates_off
from headcount.model.seq2seq import seq2seq_loss

CPU = torch.device("cpu")
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}
DTYPES = [torch.float32, torch.float64]
# Each kind's groups, per layer, as the model below is configured: written out here, not read from the model.
GROUPS = {
    "enc": [[3, 1], [1, 1, 1, 1]],  # irregular and ungrouped layers (as a structurally pruned model's are)
    "dec": [[1, 3], [2, 2]],
    "cross": [[3], [3]],  # one key/value head for all three cross-attention heads
}


def gqa_seq2seq(dtype: torch.dtype, seed: int = 0) -> EncoderDecoder:
    """2 encoder and 2 decoder layers of 4 self-attention heads, 3 narrower cross-attention heads, each kind with key
    and value groups of its own (GROUPS), every weight random."""
    cfg = ModelConfig(
        n_layers=2, encoder_layers=2, d_model=24, n_ctx=12, vocab_size=30, mlp=True,
        attn=AttentionConfig(n_heads=4, n_kv_heads=2), cross_attn=AttentionConfig(n_heads=3, n_kv_heads=1, head_dim=5),
        encoder_kv_groups_per_layer=GROUPS["enc"], kv_groups_per_layer=GROUPS["dec"],
    )  # fmt: skip
    return randomised(cfg, dtype, seed)


def expected_groups() -> list[tuple[str, str, int, list[str]]]:
    """(name, kind, layer, head labels) of every group, in the grid's order, from GROUPS."""
    rows = []
    for kind, layers in GROUPS.items():
        for layer, sizes in enumerate(layers):
            first = 0
            for g, size in enumerate(sizes):
                heads = [f"{kind}.L{layer}H{h}" for h in range(first, first + size)]
                rows.append((f"{kind}.L{layer}KV{g}", kind, layer, heads))
                first += size
    return rows


def labels_of(mask, model: EncoderDecoder) -> list[str]:
    return [model.heads_per_layer.head_label(row, head) for row, head in mask.heads_off]


def test_each_kind_s_groups_are_its_own_and_named_by_kind():
    model = gqa_seq2seq(torch.float64)
    assert [model.attention(k, layer).kv_groups for k in GROUPS for layer in range(2)] == [
        g for k in GROUPS for g in GROUPS[k]
    ]
    masks = model_kv_group_masks(model)
    got = [(m.name, m.kind, m.layer, labels_of(m, model)) for m in masks]
    assert got == expected_groups()
    assert [m.name for m in masks][:3] == ["enc.L0KV0", "enc.L0KV1", "enc.L1KV0"]
    assert masks[-1].name == "cross.L1KV0" and len(masks[-1].heads_off) == 3


def hooked_loss(model: EncoderDecoder, batch: dict, heads: list[str]) -> float:
    """The teacher-forced loss with the heads' outputs zeroed by hand: forward pre-hooks on each attention's output
    projection zero the heads' slices of its (concatenated) input, with no gate."""
    handles = []
    for label in heads:
        kind, rest = label.split(".")
        layer, head = (int(part) for part in rest[1:].split("H"))
        attn = model.attention(kind, layer)
        D = attn.head_dim

        def zero(module, args, h=head, D=D):
            (z,) = args
            z = z.clone()
            z[..., h * D : (h + 1) * D] = 0
            return (z,)

        handles.append(attn.out.register_forward_pre_hook(zero))
    try:
        with torch.no_grad():
            return float(seq2seq_loss(model, batch).double())
    finally:
        for handle in handles:
            handle.remove()


def dict_gates_loss(model: EncoderDecoder, batch: dict, gates) -> float:
    """The teacher-forced loss over every target token: EncoderDecoder's forward with gates by kind."""
    with torch.no_grad():
        logits = model(batch["src_ids"], batch["input_ids"], gates=gates, src_keep=batch["src_mask"])[:, :-1]
    logp = torch.log_softmax(logits.double(), -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    return float(-logp[batch["loss_mask"][:, 1:]].mean())


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_group_s_row_equals_its_heads_masked_together_the_forward_and_a_hand_ablation(dtype):
    model, batch = gqa_seq2seq(dtype), pairs()
    evaluator = Seq2SeqEvaluator(model, to_batches(batch, 4, CPU), masks_per_pass=1)
    grid = model.heads_per_layer
    groups = model_kv_group_masks(model)
    together = requested_masks(["+".join(heads) for *_, heads in expected_groups()], grid)
    values = evaluator.accumulate(masks_to_gates(groups + together, grid, dtype)).value("loss").tolist()
    by_group, by_heads = values[: len(groups)], values[len(groups) :]
    assert by_group == by_heads  # the same gates through the same passes: the same bits
    baseline = dict_gates_loss(model, batch, None)
    assert seq2seq_loss(model, batch).item() == pytest.approx(baseline, abs=TOLERANCE[dtype] * 10)
    for (name, _, _, heads), loss in zip(expected_groups(), by_group):
        assert loss == pytest.approx(
            dict_gates_loss(model, batch, gates_off(model, heads, dtype=dtype)), abs=TOLERANCE[dtype]
        ), name
        assert loss == pytest.approx(hooked_loss(model, batch, heads), abs=TOLERANCE[dtype] * 10), name
        assert abs(loss - baseline) > 1e-6, name  # every group's heads matter: a wrong group cannot pass unseen


def test_a_group_off_equals_the_model_pruned_without_its_key_value_head():
    model, batch = gqa_seq2seq(torch.float64), pairs()
    evaluator = Seq2SeqEvaluator(model, to_batches(batch, 8, CPU))
    masks = model_kv_group_masks(model)
    values = evaluator.accumulate(masks_to_gates(masks, model.heads_per_layer, torch.float64)).value("loss")
    for mask, loss in zip(masks, values.tolist()):
        kind, layer = mask.kind, mask.layer
        keep = {kind: gates_off(model, labels_of(mask, model), dtype=torch.float64)[kind].bool()}
        pruned = model.select_heads(keep)
        assert pruned.attention(kind, layer).n_kv_heads == model.attention(kind, layer).n_kv_heads - 1, mask.name
        assert Seq2SeqEvaluator(pruned, to_batches(batch, 8, CPU)).baseline()["loss"] == pytest.approx(loss, abs=1e-12)


def test_groups_of_one_head_are_single_head_with_its_numbers():
    model, batch = tiny_seq2seq(torch.float64), pairs()  # no grouped-query attention: every group one head
    grid = model.heads_per_layer
    groups, single = model_kv_group_masks(model), single_head_masks(grid)
    assert [m.heads_off for m in groups] == [m.heads_off for m in single]
    assert [(m.kind, m.layer) for m in groups] == [(m.kind, m.layer) for m in single]
    assert [m.name.replace("KV", "H") for m in groups] == [m.name for m in single]
    evaluator = Seq2SeqEvaluator(model, to_batches(batch, 4, CPU), masks_per_pass=3)
    value = [evaluator.accumulate(masks_to_gates(m, grid, torch.float64)).value("loss") for m in (groups, single)]
    assert torch.equal(*value)


def test_the_figure_has_a_panel_per_kind_with_each_kind_s_key_value_heads(tmp_path, monkeypatch):
    import headcount.ablation.scans.by_kind as by_kind

    drawn = []
    saved = by_kind.atomic_savefig
    monkeypatch.setattr(by_kind, "atomic_savefig", lambda fig, path, **kw: (drawn.append(fig), saved(fig, path, **kw)))
    model = gqa_seq2seq(torch.float32)
    masks = model_kv_group_masks(model)
    table = pd.DataFrame({"scan": "kv_groups", "mask": [m.name for m in masks], "kind": [m.kind for m in masks],
                          "layer": [m.layer for m in masks], "head": -1, "mode": "zero"})  # fmt: skip
    table["delta_loss"] = [0.1 * i - 0.3 for i in range(len(table))]
    path = KINDS["kv_groups"].figure(table, tmp_path / "kv_groups.png")
    assert path.stat().st_size > 1000
    panels = [ax for ax in drawn[0].axes if ax.get_xlabel() == "key/value head"]
    assert [ax.get_title() for ax in panels] == [by_kind.KIND_NAMES[kind] for kind in GROUPS]
    widths = [len(ax.get_xticks()) for ax in panels]
    assert widths == [4, 2, 1]  # enc's widest layer has 4 key/value heads, dec's 2, cross's 1

"""The kv_groups scan: one mask per key/value head, exact: its losses equal masking the group's query heads by hand and
equal the structurally pruned model without the group (the key/value head gone too)."""

import pandas as pd
import pytest
import torch

from headcount.ablation.engine.evaluator import MaskEvaluator
from headcount.ablation.engine.masks import kv_group_masks
from headcount.ablation.methods.structural import prune_heads
from headcount.ablation.scans import KINDS
from headcount.cli.train import run
from headcount.run_dir import RunPaths, load_run

SMOKE = ["model=tiny", "data=induction", "trainer=smoke", "logger=none", "data.n_train=64", "data.n_val=24"]
SMOKE += ["data.n_test=16", "data.seq_len=32", "ablation.progress=false"]


def test_kv_group_masks_cover_each_group_in_order():
    masks = kv_group_masks([[2, 2], [3, 1]])
    assert [m.name for m in masks] == ["L0KV0", "L0KV1", "L1KV0", "L1KV1"]
    assert [m.heads_off for m in masks] == [((0, 0), (0, 1)), ((0, 2), (0, 3)), ((1, 0), (1, 1), (1, 2)), ((1, 3),)]
    assert [m.name for m in kv_group_masks([[1, 1]])] == ["L0KV0", "L0KV1"]  # multi-head: one head a group


@pytest.mark.parametrize("n_kv_heads", [2, 1])
def test_kv_groups_scan_equals_masking_by_hand_and_pruning(compose_train, tmp_path, n_kv_heads):
    cfg = compose_train([*SMOKE, f"model.attn.n_kv_heads={n_kv_heads}", "ablation=[single_head,kv_groups]"])
    run(cfg, tmp_path)
    table = pd.read_csv(RunPaths(tmp_path).ablation / "kv_groups.csv")
    finished = load_run(tmp_path, cfg)
    model, batches = finished.model, finished.eval_batches()
    assert table["mask"].tolist() == [f"L{layer}KV{g}" for layer in range(2) for g in range(n_kv_heads)]
    assert table["kv_head"].tolist() == [g for _ in range(2) for g in range(n_kv_heads)]
    assert (table["n_heads_off"] == 4 // n_kv_heads).all()

    evaluator = MaskEvaluator(model, batches)
    for row in table.itertuples():
        layer, g, size = row.layer, row.kv_head, row.n_heads_off
        gates_1LH = torch.ones(1, model.n_layers, model.max_heads)
        gates_1LH[0, layer, g * size : (g + 1) * size] = 0
        assert float(evaluator.evaluate(gates_1LH)["loss"][0]) == pytest.approx(row.loss, abs=1e-6)
        remove_LH = gates_1LH[0] == 0
        pruned = prune_heads(model, remove_LH)
        assert pruned.blocks[layer].attn.n_kv_heads == n_kv_heads - 1
        assert MaskEvaluator(pruned, batches).baseline()["loss"] == pytest.approx(row.loss, abs=1e-5)
    assert (RunPaths(tmp_path).ablation / "kv_groups.png").stat().st_size > 1000


def test_kv_groups_figure_is_written(tmp_path):
    masks = kv_group_masks([[3, 3, 3]] * 4)
    table = pd.DataFrame(
        {"scan": "kv_groups", "mask": [m.name for m in masks], "layer": [m.layer for m in masks], "mode": "zero"}
    )
    table["delta_loss"] = range(len(table))
    path = KINDS["kv_groups"].figure(table, tmp_path / "kv_groups.png")
    assert path.stat().st_size > 1000

"""An encoder-decoder's mask evaluations over two CPU processes (Lightning's DDP, gloo) through the ScanWorld a scan
uses, or in this process alone: `python tests/distributed_seq2seq.py OUT` saves, for float64 and float32, every mask's
totals (the first process writes); tests/test_distributed_seq2seq.py compares them with one process's. Lightning's
launcher reruns this command for the second process."""

import sys
from pathlib import Path

import torch
from seq2seq_cases import pairs
from test_seq2seq_kv_groups import gqa_seq2seq

from headcount.ablation.engine.masks import layer_masks, leave_one_in_masks, requested_masks, single_head_masks
from headcount.ablation.engine.seq2seq_evaluator import Seq2SeqEvaluator
from headcount.ablation.records.distributed import ScanWorld, evaluate_resumably, scan_world
from headcount.ablation.scans.kv_groups import model_kv_group_masks
from headcount.config.train import TrainerConfig
from headcount.data.examples import to_batches

DTYPES = (torch.float64, torch.float32)


def totals(dtype: torch.dtype, world: ScanWorld | None, folder: Path) -> dict[str, torch.Tensor]:
    """Every mask kind's totals on the grouped-query encoder-decoder: single heads, layers, leave-one-in, key/value
    groups of each kind and masks across kinds, 7 examples in batches of 2 (4 batches), 3 masks a pass."""
    model = gqa_seq2seq(dtype)
    evaluator = Seq2SeqEvaluator(model, to_batches(pairs(), 2, torch.device("cpu")), masks_per_pass=3)
    grid = model.heads_per_layer
    masks = [*single_head_masks(grid), *layer_masks(grid), *leave_one_in_masks(grid), *model_kv_group_masks(model)]
    masks += requested_masks(["enc.L0H1+cross.L1H0", "dec.L1H2+cross.L0H1+enc.L1H3"], grid)
    partial = folder / f"scan.{dtype}.partial.csv"
    t = evaluate_resumably(evaluator, masks, partial, "seq2seq", "seq2seq masks", False, world=world)
    return {"sums": t.sums, "examples": t.examples, "n_targets": t.n_targets, "batches_done": t.batches_done}


if __name__ == "__main__":
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    world = scan_world(TrainerConfig(accelerator="cpu", devices=2, strategy="ddp"))
    result = {str(dtype): totals(dtype, world, out.parent) for dtype in DTYPES}
    if world.rank == 0:
        torch.save({"totals": result, "size": world.size, "reduce_seconds": world.reduce_seconds}, out)

"""The circuits core's per-example evaluations over two CPU processes (Lightning's DDP, gloo) through the ScanWorld a
scan uses, or in this process alone: `python tests/distributed_edges.py OUT DTYPE` saves the tables (the first process
writes) and edge pruning's learned log_alpha; tests/test_distributed_edges.py compares them with one process's.
Lightning's launcher reruns this command for the second process."""

import sys

import torch
from test_circuits import make_model, prompts

from headcount.ablation.methods.edge_pruning import edge_pruning
from headcount.ablation.records.distributed import ScanWorld, per_example_tables, scan_world
from headcount.circuits import Graph, PointMetric
from headcount.circuits.attribution import eap_ig_scores, eap_scores, exact_edge_scores
from headcount.circuits.faithfulness import circuit_metrics
from headcount.circuits.forward import outputs_of
from headcount.circuits.path_patching import path_patch
from headcount.circuits.shares import ExampleShare
from headcount.config.scans import EdgePruningSettings
from headcount.config.train import TrainerConfig

EXAMPLES, T = 7, 6  # split 4 and 3
PAIRS = [(["L0H1"], ["L1H0.k"]), (["emb"], ["L1H2.v", "logits"]), (["L0H0", "L0.mlp"], ["L1.mlp"])]


def answer_gap(logits_PV: torch.Tensor, answer_P: torch.Tensor, wrong_P: torch.Tensor) -> torch.Tensor:
    return logits_PV.gather(1, answer_P[:, None])[:, 0] - logits_PV.gather(1, wrong_P[:, None])[:, 0]


def inputs(dtype: torch.dtype):
    """The model, clean and corrupted ids, score points (odd examples scored twice: a share's metric must take its
    points' answers) and a metric reading each point's own answer and wrong answer."""
    model = make_model("gpt2", dtype)
    clean, corrupted = prompts(EXAMPLES, T)
    points_BT = torch.zeros(EXAMPLES, T, dtype=torch.bool)
    points_BT[:, -1] = True
    points_BT[1::2, 2] = True
    g = torch.Generator().manual_seed(5)
    answer_P, wrong_P = (torch.randint(0, 10, (int(points_BT.sum()),), generator=g) for _ in range(2))
    return model, clean, corrupted, points_BT, PointMetric(answer_gap, answer_P, wrong_P)


def tables(dtype: torch.dtype, world: ScanWorld | None) -> dict[str, torch.Tensor]:
    """Every per-example evaluation the edge scans run, on each process's share of the examples."""
    model, clean, corrupted, points_BT, metric = inputs(dtype)
    zero = outputs_of(model, corrupted)  # a run given as outputs (zero mode's kind) is sliced, not run again
    zero = type(zero)(torch.zeros_like(zero.emb), [torch.zeros_like(z) for z in zero.z], [m * 0 for m in zero.mlp])
    circuits = [set(range(0, len(Graph.of(model).edges), 3)), {0, 5, 9}]

    def compute(examples: slice) -> dict[str, torch.Tensor]:
        share = ExampleShare.of(clean, corrupted, points_BT, metric, examples)
        zeroed = ExampleShare.of(clean, zero, points_BT, metric, examples)
        args = (model, share.clean_ids_BT, share.corrupted, share.metric)
        return {
            "exact": exact_edge_scores(*args, share.points_BT, per_example=True),
            "eap": eap_scores(*args, share.points_BT, per_example=True),
            "eap_zero": eap_scores(
                model, zeroed.clean_ids_BT, zeroed.corrupted, zeroed.metric, zeroed.points_BT, None, True
            ),
            "eap_ig": eap_ig_scores(*args, 3, share.points_BT, per_example=True),
            "path": path_patch(
                model, share.clean_ids_BT, share.corrupted, PAIRS, share.metric, share.points_BT, per_example=True
            ),
            "circuits": circuit_metrics(
                model, share.clean_ids_BT, share.corrupted, circuits, share.metric, share.points_BT
            ),
        }

    return per_example_tables(world, EXAMPLES, compute)


def pruned(dtype: torch.dtype, world: ScanWorld | None):
    """Edge pruning's steps on the 7 examples in one batch (shared 4 and 3 over two processes), both objectives."""
    model, clean, corrupted, points_BT, metric = inputs(dtype)
    result = {}
    for objective in ("kl", "metric"):
        cfg = EdgePruningSettings(steps=6, lr=0.3, target_sparsity=0.5, target_warmup=0.5, objective=objective)
        result[objective] = edge_pruning(model, clean, corrupted, metric, cfg, points_BT, world=world)
    return result


if __name__ == "__main__":
    out, dtype = sys.argv[1], getattr(torch, sys.argv[2])
    torch.set_num_threads(1)
    world = scan_world(TrainerConfig(accelerator="cpu", devices=2, strategy="ddp"))
    result = tables(dtype, world)
    learned = pruned(dtype, world)
    if world.rank == 0:
        saved = {"tables": result, "size": world.size, "reduce_seconds": world.reduce_seconds}
        saved["edge_pruning"] = {k: (v.log_alpha, v.history) for k, v in learned.items()}
        torch.save(saved, out)

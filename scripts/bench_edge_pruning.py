"""The cost of each edge_attribution method on a finished run, in CPU seconds and in forward-equivalents (a method's
CPU seconds over those of one plain forward of the model on the same prompts), and their CPR and CMD (MIB;
headcount/circuits/cpr.py): the edge_attribution scan with methods edge_pruning and ensemble, each method's call timed
where the scan makes it (process CPU time, every thread).

    headcount-train experiment=induction_heads      # the quickstart's induction model (outputs/experiments/...)
    python scripts/bench_edge_pruning.py RUN_DIR [--mode zero] [--steps 200] [--sparsity 0.9] [--warm-start]
"""

import argparse
import time

import pandas as pd
import torch

import headcount
from headcount.ablation.scans import edge_attribution

TIMED = ("eap_scores", "eap_ig_scores", "exact_edge_scores", "edge_pruning")


def timed(name: str, fn, seconds: dict, extra: dict):
    def wrapper(model, clean, *args, **kwargs):
        if "forward" not in seconds:  # one plain forward of the model on the same prompts, the unit
            with torch.no_grad():
                model(clean)  # warm
                start = time.process_time()
                model(clean)
                seconds["forward"] = time.process_time() - start
        start = time.process_time()
        result = fn(model, clean, *args, **kwargs)
        seconds[name] = time.process_time() - start
        if name == "edge_pruning":
            extra.update(steps=result.steps, examples_per_step=result.examples_per_step, kept=int(result.kept.sum()))
        extra.setdefault("examples", len(clean))
        return result

    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--mode", default="zero", help="zero, resample or patch")
    parser.add_argument("--steps", type=int, default=200, help="edge pruning's optimiser steps")
    parser.add_argument("--sparsity", type=float, default=0.9, help="edge pruning's target sparsity")
    parser.add_argument("--warm-start", action="store_true", help="start edge pruning from EAP-IG's ranking")
    parser.add_argument("--n-eval", type=int, default=None, help="evaluate on the first n examples (default: all)")
    args = parser.parse_args()
    seconds: dict[str, float] = {}
    extra: dict = {}
    for name in TIMED:
        setattr(edge_attribution, name, timed(name, getattr(edge_attribution, name), seconds, extra))
    run = headcount.load_run(args.run_dir, device="cpu")
    pruning = {"steps": args.steps, "target_sparsity": args.sparsity, "warm_start": args.warm_start}
    settings = {"n_eval": args.n_eval} if args.n_eval else {}
    start = time.perf_counter()
    table = run.scan(
        "edge_attribution",
        mode=args.mode,
        verify_top_k=0,
        circuit_sizes=[16],
        random_sets=1,
        methods=["edge_pruning", "ensemble"],
        edge_pruning=pruning,
        **settings,
    )
    wall = time.perf_counter() - start
    if "edge_pruning" not in seconds:
        print("the scan was read back (up to date): nothing timed; remove its tables or change a setting")
        return
    print(f"{len(table)} edges, {extra['examples']} examples, mode {args.mode}, scan {wall:.0f} s wall")
    print(f"one plain forward: {seconds['forward']:.3f} CPU s")
    for name in TIMED:
        if name in seconds:
            print(f"{name}: {seconds[name]:.2f} CPU s, {seconds[name] / seconds['forward']:.0f} forward-equivalents")
    print(
        f"edge pruning: {extra['steps']} steps of {extra['examples_per_step']} examples, kept {extra['kept']} edges "
        f"(target sparsity {args.sparsity}{', warm-started from EAP-IG' if args.warm_start else ''})"
    )
    areas = pd.read_csv(run.ablation_dir / "edge_attribution_cpr.csv")
    pd.set_option("display.width", 160)
    print(areas.to_string(index=False, float_format=lambda v: f"{v:.3f}"))


if __name__ == "__main__":
    main()

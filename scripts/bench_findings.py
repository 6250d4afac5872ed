"""Time the encoder and encoder-decoder findings (issue 35) as a user runs them, one command each, and print a table:
wall time and CPU time (user + system of the command and its children, from /usr/bin/time -v), the machine's
1-minute load average sampled every 10 s while it ran (the cores may be shared), the finding's verdict, and for the
translation findings the model's greedy BLEU (sacrebleu) and teacher-forced loss (findings/findings.json).

    python scripts/bench_findings.py --size smoke              # seconds each: checks the pipeline
    python scripts/bench_findings.py                           # the sizes README gives (minutes each on 2 cores)
    python scripts/bench_findings.py --only nmt_heads --workdir /tmp/bench

Each command runs in --workdir (default: a new temporary folder), so its outputs/ land there.
"""

import argparse
import json
import os
import re
import subprocess
import tempfile
import threading
import time
from pathlib import Path

FINDINGS = ("nmt_heads", "nmt_roles", "clark_attention")


def sample_load(samples: list[float], stop: threading.Event) -> None:
    while True:
        samples.append(os.getloadavg()[0])
        if stop.wait(10):
            return


def run(experiment: str, size: str | None, workdir: Path) -> dict:
    args = ["headcount-train", f"experiment={experiment}"] + ([f"size={size}"] if size else [])
    samples: list[float] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_load, args=(samples, stop))
    sampler.start()
    start = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-v", *args], cwd=workdir, capture_output=True, text=True)
    wall = time.perf_counter() - start
    stop.set()
    sampler.join()
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    user = float(re.search(r"User time \(seconds\): ([\d.]+)", done.stderr).group(1))
    system = float(re.search(r"System time \(seconds\): ([\d.]+)", done.stderr).group(1))
    run_dir = workdir / "outputs" / "experiments" / experiment / (f"size={size}" if size else "")
    findings = json.loads((run_dir / "findings" / "findings.json").read_text())
    numbers = findings.get("numbers", {})
    return {
        "command": " ".join(args),
        "wall_s": wall,
        "cpu_s": user + system,
        "load_mean": sum(samples) / len(samples),
        "load_max": max(samples),
        "verdict": findings["verdict"],
        "bleu": numbers.get("baseline_bleu"),
        "loss": numbers.get("baseline_loss"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default=None, help="an experiment size (smoke); default: the experiment's own")
    parser.add_argument("--only", nargs="*", default=list(FINDINGS), choices=FINDINGS)
    parser.add_argument("--workdir", type=Path, default=None)
    opts = parser.parse_args()
    workdir = opts.workdir or Path(tempfile.mkdtemp(prefix="bench_findings_"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"outputs under {workdir}; {os.cpu_count()} cores")
    print("| command | wall | CPU (user + system) | load (mean, max) | verdict | BLEU | loss |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for experiment in opts.only:
        r = run(experiment, opts.size, workdir)
        bleu = "" if r["bleu"] is None else f"{r['bleu']:.1f}"
        loss = "" if r["loss"] is None else f"{r['loss']:.6f}"
        print(
            f"| `{r['command']}` | {r['wall_s']:.1f} s | {r['cpu_s']:.1f} s | {r['load_mean']:.1f}, "
            f"{r['load_max']:.1f} | {r['verdict']} | {bleu} | {loss} |",
            flush=True,
        )


if __name__ == "__main__":
    main()

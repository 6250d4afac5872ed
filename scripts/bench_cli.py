"""How long the commands take to answer a config mistake or `--list`: wall seconds of each command as a subprocess,
the median of --runs runs, beside the imports it would otherwise wait for (`import torch`, `import lightning`).

    python scripts/bench_cli.py [--runs 5] [--src /path/to/a/checkout/src]

--src times another checkout's code (PYTHONPATH), e.g. the one before the commands checked a config before loading
torch. The machine's load average is printed before and after: on a shared machine, compare only runs made together.
"""

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# (label, command, arguments); RUN is a folder that looks like a finished run (the names are refused before it is
# read), NOSUCH a folder without runs
COMMANDS = [
    ("headcount-train --list", "train", ["--list"]),
    ("headcount-train model=nosuch", "train", ["model=nosuch"]),
    ("headcount-train ablation.mode=zro", "train", ["ablation.mode=zro"]),
    ("headcount-ablate --list", "ablate", ["--list"]),
    ("headcount-ablate run_dir=RUN ablation.mode=zro", "ablate", ["run_dir=RUN", "ablation.mode=zro"]),
    ("headcount-report NOSUCH", "report", ["NOSUCH"]),
]
IMPORTS = [("python -c 'import torch'", "import torch"), ("python -c 'import lightning'", "import lightning")]


def finished_looking_run(folder: Path) -> Path:
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text("seed: 0\n")
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "last.ckpt").write_bytes(b"")
    (folder / "metrics.json").write_text("{}")
    return folder


def wall_seconds(argv: list[str], cwd: Path, env: dict, expect: tuple[int, ...]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - start
    if done.returncode not in expect:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return seconds


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per command (the median is reported)")
    parser.add_argument("--src", type=Path, default=SRC, help="the checkout's src folder whose code is timed")
    parser.add_argument("--no-imports", action="store_true", help="skip timing `import torch` and `import lightning`")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(args.src.resolve()), "COLUMNS": "200"}
    print(
        f"{cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {version('torch')}, "
        f"lightning {version('lightning')}, hydra-core {version('hydra-core')}; code: {args.src.resolve()}"
    )
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        run, nosuch = finished_looking_run(cwd / "run"), cwd / "nosuch"
        timed = [
            (label, [sys.executable, "-m", f"headcount.cli.{command}", *a], (0, 2))
            for label, command, a in COMMANDS
            for a in [[arg.replace("RUN", str(run)).replace("NOSUCH", str(nosuch)) for arg in a]]
        ]
        if not args.no_imports:
            timed += [(label, [sys.executable, "-c", code], (0,)) for label, code in IMPORTS]
        for label, argv, expect in timed:
            times = [wall_seconds(argv, cwd, env, expect) for _ in range(args.runs)]
            rows.append((label, statistics.median(times), min(times), max(times)))
            print(f"{label:<52} median {rows[-1][1]:6.2f} s  (min {rows[-1][2]:.2f}, max {rows[-1][3]:.2f})",
                  flush=True)  # fmt: skip
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

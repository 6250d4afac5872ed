"""The benchmark scripts still run against the code they measure (a signature change once broke bench_train.py
silently): each at its smallest setting, checking that it prints its table. Their figures are in docs/BENCHMARKS.md."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_bench_train_runs_every_variant():
    command = [sys.executable, str(REPO / "scripts" / "bench_train.py"), "--rounds", "1", "--steps", "1"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for variant in ("plain attention", "headcount, no gates", "gates (L, H) = 1", "gates (B, L, H) = 1"):
        assert variant in proc.stdout, proc.stdout


def test_bench_hooks_runs_every_variant():
    command = [sys.executable, str(REPO / "scripts" / "bench_hooks.py"), "--repeats", "1", "--batch", "1"]
    proc = subprocess.run([*command, "--seq-len", "8", "--device", "cpu"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for variant in ("plain", "empty intervention", "resid hook per layer", "z hook per layer", "q_input hook"):
        assert variant in proc.stdout, proc.stdout

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


def test_bench_cli_times_every_command():
    command = [sys.executable, str(REPO / "scripts" / "bench_cli.py"), "--runs", "1", "--no-imports"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for label in ("headcount-train --list", "headcount-train ablation.mode=zro", "headcount-report NOSUCH"):
        assert f"{label} " in proc.stdout and "median" in proc.stdout, proc.stdout


def test_bench_shared_times_both_policies_idle_and_beside_busy_processes():
    command = [sys.executable, str(REPO / "scripts" / "bench_shared.py"), "--rounds", "1", "--steps", "1"]
    proc = subprocess.run(command + ["--seconds", "5", "--busy", "1"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for setting in ("idle (no added load)", "beside 1 busy process"):
        for policy in ("OMP_WAIT_POLICY=(unset)", "OMP_WAIT_POLICY=PASSIVE"):
            assert any(setting in line and policy in line for line in proc.stdout.splitlines()), proc.stdout


def test_bench_hooks_runs_every_variant():
    command = [sys.executable, str(REPO / "scripts" / "bench_hooks.py"), "--repeats", "1", "--batch", "1"]
    proc = subprocess.run([*command, "--seq-len", "8", "--device", "cpu"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for variant in ("plain", "empty intervention", "resid hook per layer", "z hook per layer", "q_input hook"):
        assert variant in proc.stdout, proc.stdout

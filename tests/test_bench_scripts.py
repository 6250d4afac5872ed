"""The benchmark scripts still run against the code they measure (a signature change once broke bench_train.py
silently): each at its smallest setting, checking that it prints its table. Their figures are in docs/BENCHMARKS.md."""

import re
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


def test_bench_gpu_runs_every_figure_at_a_cpu_size(tmp_path):
    """The GPU script's every step at its CPU size: each figure written, positive and consistent with its parts."""
    import json

    out = tmp_path / "figures.json"
    command = [sys.executable, str(REPO / "scripts" / "bench_gpu.py"), "--cpu-size", "--out", str(out)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["size"] == "cpu" and figures["training"]["tokens_per_s"] > 0
    scan = figures["head_scan"]
    assert scan["masks"] == 8 and scan["headcount_masks_per_s"] == scan["masks"] / scan["headcount_s"]
    if "transformer_lens_s" in scan:  # where TransformerLens is installed: the same losses
        assert scan["largest_loss_difference"] < 1e-4
    else:
        assert scan["transformer_lens"].startswith("not installed")
    edges = figures["edges"]
    assert edges["edges"] == 110 and edges["examples"] == 16  # 2 layers x 4 heads with MLPs, headcount's counting
    reference = 32_491 * 1000 / 16.0
    assert abs(edges["eap_vs_reference"] - edges["eap_edge_scores_per_s"] / reference) < 1e-12
    assert edges["eap_edge_scores_per_s"] == edges["edges"] * edges["examples"] / edges["eap_s"]
    ladder = figures["largest_eap_ig"]
    assert [t["model"] for t in ladder["tried"]] == ["2 x 64", "3 x 96"] and ladder["largest"]["model"] == "3 x 96"


def test_bench_gpu_refuses_to_run_without_a_gpu_unless_asked_for_the_cpu_size(tmp_path):
    import pytest

    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    out = tmp_path / "figures.json"
    command = [sys.executable, str(REPO / "scripts" / "bench_gpu.py"), "--out", str(out)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "no CUDA device; --cpu-size" in proc.stderr and not out.exists()


def test_bench_tl_agrees_with_transformer_lens_on_a_tiny_model():
    """bench_tl.py on a random 3-layer grouped Llama: every job's numbers checked equal to TransformerLens 4.3's
    (the script exits non-zero when they differ). Runs where transformer-lens is installed (its own venv)."""
    import pytest

    pytest.importorskip("transformer_lens")
    command = [
        sys.executable,
        str(REPO / "scripts" / "bench_tl.py"),
        "--model",
        "tiny",
        "--prompts",
        "4",
        "--rounds",
        "1",
    ]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for job in ("zero scan", "patch scan", "path patching", "EAP, every edge"):
        assert f"{job}: headcount against TransformerLens, largest difference" in proc.stdout, proc.stdout
    assert (
        "(GQA/MQA)" in proc.stdout
        and "ungrouped copy of tiny: logits differ from the grouped model's by" in proc.stdout
    )


def test_bench_skip_gives_the_same_patch_scan_with_and_without_skipping():
    command = [sys.executable, str(REPO / "scripts" / "bench_skip.py"), "--model", "tiny", "--prompts", "4"]
    proc = subprocess.run(command + ["--rounds", "1"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "positions run per batch: " in proc.stdout and "per batch: all" not in proc.stdout, proc.stdout
    diff = float(proc.stdout.rsplit("largest difference of the per-head values ", 1)[1].split()[0])
    assert diff < 1e-5


def test_bench_edge_pruning_smollm2_times_every_method_on_a_tiny_model():
    script = REPO / "scripts" / "bench_edge_pruning_smollm2.py"
    command = [sys.executable, str(script), "--model", "tiny", "--prompts", "4", "--steps", "2", "--batch", "2"]
    proc = subprocess.run(command + ["--repeats", "1"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for label in ("EAP:", "EAP-IG (5 steps):", "edge pruning: 2 steps of 2 prompts"):
        assert label in proc.stdout, proc.stdout


def test_bench_mib_smollm2_compares_every_method_on_a_tiny_model(tmp_path):
    """bench_mib_smollm2.py (docs/BENCHMARKS.md's MIB comparisons on SmolLM2 and Gemma-3): every ranking's CPR and
    CMD, the exact scores' cost timed on a sample, and a bad --exact-sample refused in one line."""
    script = REPO / "scripts" / "bench_mib_smollm2.py"
    command = [sys.executable, str(script), "--model", "tiny", "--prompts", "4", "--steps", "2", "--batch", "2"]
    command += ["--resamples", "20", "--memory-mb", "64", "--out", str(tmp_path / "out")]
    proc = subprocess.run(command + ["--exact-sample", "3"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    exact = r"exact scores of 3 random edges: .* \(([\d.]+) an edge\); every edge: about ([\d,]+) CPU s"
    timed = re.search(exact, proc.stdout)
    assert timed, proc.stdout
    edges = int(re.search(r": (\d+) edges;", proc.stdout).group(1))  # the extrapolation: per edge x every edge
    per_edge, total = float(timed.group(1)), float(timed.group(2).replace(",", ""))
    assert abs(total - per_edge * edges) <= 0.5 + 0.0005 * edges, proc.stdout
    assert re.search(r"^EAP: [\d.]+ CPU s \([\d.]+ forward-equivalents\)", proc.stdout, re.MULTILINE), proc.stdout
    for method in ("EAP", "EAP-IG", "edge pruning", "ensemble", "random"):  # the areas table: method, draw, CPR, ...
        assert re.search(rf"^ *{method} +0 +-?\d+\.\d{{3}} ", proc.stdout, re.MULTILINE), proc.stdout
    bad = subprocess.run(command + ["--exact-sample", "-1"], capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1].startswith("--exact-sample: -1; allowed 0 to")

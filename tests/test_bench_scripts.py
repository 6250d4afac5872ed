"""The benchmark scripts still run against the code they measure (a signature change once broke bench_train.py
silently): each at its smallest setting, checking that it prints its table. Their figures are in docs/BENCHMARKS.md."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

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


def test_bench_mib_smollm2_passes_the_edge_pruning_settings_and_saves_what_it_learned(tmp_path):
    """--penalty-lr and --warmup reach the training (its first multiplier step and target), the learned log_alpha is
    saved beside the scores it ranks by (scores = log_alpha - min), and the printed density line and kept count are
    the history's and the masks' own."""
    from headcount.ablation.methods.l0_gates import expected_open
    from headcount.config.scans import EdgePruningSettings

    script = REPO / "scripts" / "bench_mib_smollm2.py"
    command = [sys.executable, str(script), "--model", "tiny", "--prompts", "4", "--steps", "4", "--batch", "2"]
    command += ["--lr", "1.0", "--penalty-lr", "3.0", "--warmup", "0.25", "--warm-start", "--resamples", "20"]
    command += ["--methods", "edge pruning,ensemble", "--out", str(tmp_path)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    scores_path = tmp_path / "edge_pruning_warm_lr1.0_pl3.0_wu0.25_4x2_s0.95_tiny_4.pt"
    history = pd.read_csv(scores_path.with_suffix(".history.csv"))
    assert list(history["step"]) == [0, 1, 2, 3]
    assert history["target_density"][0] == pytest.approx(0.05)  # warm-up of round(0.25 * 4) = 1 step
    first_violation = history["density"][0] - history["target_density"][0]
    assert history["lambda_1"][1] == pytest.approx(3.0 * first_violation)
    assert history["lambda_2"][1] == pytest.approx(3.0 * first_violation**2)
    log_alpha = torch.load(scores_path.with_suffix(".log_alpha.pt"))
    torch.testing.assert_close(torch.load(scores_path), log_alpha - log_alpha.min(), rtol=0, atol=0)
    kept = int((expected_open(log_alpha, EdgePruningSettings()) > 0.5).sum())
    assert 0 < kept < len(log_alpha)  # lr 1.0 closes some edges in 4 steps: the count tells log_alpha from its shift
    assert f"{kept} edges kept (P(open) > 1/2)" in proc.stdout, proc.stdout
    line = proc.stdout.split("expected density by step: ", 1)[1].splitlines()[0]
    expected = ", ".join(f"{step}: {density:.3f}" for step, density in zip(history["step"], history["density"]))
    assert line == expected
    assert (tmp_path / "areas_warm_lr1.0_pl3.0_wu0.25_4_tiny_4_edge-pruning_ensemble.csv").exists()


def test_bench_mib_smollm2_density_line_picks_every_tenth_step_and_the_last():
    sys.path.insert(0, str(REPO / "scripts"))
    spec = importlib.util.spec_from_file_location("bench_mib_smollm2", REPO / "scripts" / "bench_mib_smollm2.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    history = [dict(step=step, density=1 - step / 100) for step in range(31)]
    line = bench.density_by_step(history)
    assert line == ", ".join(f"{step}: {1 - step / 100:.3f}" for step in [0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30])


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

"""Edge scans over two CPU processes (Lightning's DDP, gloo): each process evaluates a contiguous share of the
examples, the per-example tables are all-reduced in float64, and the result equals one process's: exact, EAP (ids and
given outputs), EAP-IG, path patching and circuits' metrics within 1e-12 in float64 and within float32 rounding; and
the edge_attribution and path_patching scans of headcount-ablate write the tables one process writes. Edge pruning's
steps, each batch shared over the processes and the gradients all-reduced, learn one process's log_alpha.

Every command runs with one thread per process (OMP_NUM_THREADS=1), as tests/test_distributed.py's do."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from distributed_edges import PAIRS, inputs, pruned, tables
from test_distributed import TASK, TWO_PROCESSES, ablate, copy_of, trained  # noqa: F401 (a fixture)

from headcount.circuits.attribution import eap_ig_scores, eap_scores, exact_edge_scores
from headcount.circuits.path_patching import path_patch
from headcount.circuits.shares import example_share
from headcount.run_dir import RunPaths

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "distributed_edges.py"
EDGE_SCANS = ["ablation=[edge_attribution,path_patching]", "ablation.mode=patch", "ablation.metric=logit_diff"]
EDGE_SCANS += ["task=file", f"task.path={TASK}", "ablation.scans.edge_attribution.steps=2"]
EDGE_SCANS += ["ablation.scans.edge_attribution.random_sets=1", "ablation.scans.edge_attribution.circuit_size=10"]
EDGE_SCANS += [
    "ablation.scans.edge_attribution.methods=[edge_pruning]",
    "ablation.scans.edge_attribution.edge_pruning.steps=4",
]


def test_shares_cover_every_example_once_in_order():
    for n in (0, 1, 2, 7, 8, 100):
        for size in (1, 2, 3, 5):
            shares = [example_share(n, size, rank) for rank in range(size)]
            assert [i for s in shares for i in range(n)[s]] == list(range(n))  # contiguous, in rank order, each once
            lengths = [s.stop - s.start for s in shares]
            assert max(lengths) - min(lengths) <= 1
    with pytest.raises(ValueError):
        example_share(5, 2, 2)


def two_processes(tmp_path: Path, dtype: str) -> dict:
    out = tmp_path / f"{dtype}.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO / 'tests'}"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), dtype], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_two_processes_compute_one_processs_per_example_tables(tmp_path, dtype):
    torch.set_num_threads(1)
    two = two_processes(tmp_path, dtype)
    assert two["size"] == 2 and two["reduce_seconds"] > 0
    one = tables(getattr(torch, dtype), None)
    assert two["tables"].keys() == one.keys()
    tol = 1e-12 if dtype == "float64" else 1e-5
    for name, table in one.items():
        assert table.dtype == torch.float64 and two["tables"][name].shape == table.shape
        torch.testing.assert_close(two["tables"][name], table, rtol=tol, atol=tol, msg=name)
    # the scores are the tables' sums over examples: those of the core run on every example at once
    model, clean, corrupted, points_BT, metric = inputs(getattr(torch, dtype))
    args = (model, clean, corrupted, metric)
    whole = {
        "exact": exact_edge_scores(*args, points_BT),
        "eap": eap_scores(*args, points_BT),
        "eap_ig": eap_ig_scores(*args, 3, points_BT),
        "path": path_patch(model, clean, corrupted, PAIRS, metric, points_BT),
    }
    for name, scores in whole.items():
        torch.testing.assert_close(two["tables"][name].sum(0), scores, rtol=tol, atol=tol, msg=name)
    # edge pruning: each step's batch shared 4 and 3, the gradients all-reduced: one process's steps, mask by mask
    one_process = pruned(getattr(torch, dtype), None)
    for objective, (log_alpha, history) in two["edge_pruning"].items():
        one_pruned = one_process[objective]
        assert not torch.equal(one_pruned.log_alpha, torch.full_like(one_pruned.log_alpha, 3.0))  # it trained
        torch.testing.assert_close(log_alpha, one_pruned.log_alpha, rtol=tol, atol=tol, msg=objective)
        assert [h["step"] for h in history] == [h["step"] for h in one_pruned.history]
        for got, expected in zip(history, one_pruned.history):
            for key in ("task_loss", "density", "lambda_1", "lambda_2"):
                assert got[key] == pytest.approx(expected[key], rel=tol, abs=tol), (objective, key)


def test_two_process_edge_scans_write_the_tables_of_one(trained, tmp_path):  # noqa: F811
    one = copy_of(trained, tmp_path / "one")
    ablate(one, *EDGE_SCANS)
    two = copy_of(trained, tmp_path / "two")
    ablate(two, *EDGE_SCANS, *TWO_PROCESSES)
    folder_one, folder_two = RunPaths(one).ablation, RunPaths(two).ablation
    csvs = sorted(p.relative_to(folder_one) for p in folder_one.rglob("*.csv"))
    assert {p.name for p in csvs} >= {"edge_attribution.patch.logit_diff.csv", "path_patching.patch.logit_diff.csv"}
    assert sorted(p.relative_to(folder_two) for p in folder_two.rglob("*.csv")) == csvs
    for name in csvs:
        expected, got = pd.read_csv(folder_one / name), pd.read_csv(folder_two / name)
        # float32 activations: each process's passes hold other examples, so values agree within rounding, and ranks
        # wherever the damages they order differ by more than that (paths of no effect tie at rounding's scale)
        if "rank" in expected and "damage" in expected:
            assert_same_order(got["rank"], expected["rank"], expected["damage"], 1e-5)
            expected, got = expected.drop(columns="rank"), got.drop(columns="rank")
        pd.testing.assert_frame_equal(got, expected, check_exact=False, rtol=1e-4, atol=1e-5, obj=str(name))


def assert_same_order(got: pd.Series, expected: pd.Series, value: pd.Series, tol: float) -> None:
    """Ranks that order every two rows whose values differ by more than tol alike."""
    for i in range(len(value)):
        for j in range(len(value)):
            if value[i] - value[j] > tol:
                assert expected[i] < expected[j] and got[i] < got[j], (i, j)

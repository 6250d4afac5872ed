"""An encoder-decoder's mask scans over two CPU processes (Lightning's DDP, gloo), the path a decoder's take
(ablation/records/distributed.py): the one-process pass plan's passes are shared out whole, each costed by the
encoder-decoder's evaluator (both stacks from the encoder, the decoder's layers alone), and the float64 sums
all-reduced. Every mask of every kind (single heads, layers, leave-one-in, each kind's key/value groups, masks across
kinds) ends with one process's totals: within 1e-12 in float64 and within float32 rounding (at one thread per process
they are the same bits). headcount-ablate with trainer.devices=2 writes the tables one process writes, those of the
scans that evaluate no masks (importance, attribution, l0_gates: run whole in each process) too.

Every command runs with one thread per process (OMP_NUM_THREADS=1), as tests/test_distributed.py's do."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from distributed_seq2seq import DTYPES, totals
from test_distributed import TWO_PROCESSES, ablate, command, copy_of

from headcount.ablation.engine.seq2seq_evaluator import DECODER_STARTS, ENCODER_STARTS, UNTOUCHED, Seq2SeqEvaluator
from headcount.run_dir import RunPaths

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "distributed_seq2seq.py"
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-6}


def test_two_processes_give_every_mask_one_process_s_totals(tmp_path):
    torch.set_num_threads(1)
    out = tmp_path / "two" / "totals.pt"
    out.parent.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO / 'tests'}"}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = torch.load(out)
    assert two["size"] == 2 and two["reduce_seconds"] > 0
    for dtype in DTYPES:
        one, got = totals(dtype, None, tmp_path), two["totals"][str(dtype)]
        assert bool((one["batches_done"] == 4).all()) and torch.equal(got["batches_done"], one["batches_done"])
        assert torch.equal(got["n_targets"], one["n_targets"])
        for name in ("sums", "examples"):
            assert got[name].dtype == torch.float64
            tol = TOLERANCE[dtype]
            torch.testing.assert_close(got[name], one[name], rtol=tol, atol=tol, msg=f"{dtype} {name}")
        assert len(one["sums"].unique()) > len(one["sums"]) // 2  # the masks' numbers differ: a swap would show


def test_an_encoder_decoder_s_passes_are_costed_by_the_layers_they_run():
    from seq2seq_cases import pairs, tiny_seq2seq

    from headcount.data.examples import to_batches

    evaluator = Seq2SeqEvaluator(tiny_seq2seq(torch.float32), to_batches(pairs(), 4, torch.device("cpu")))
    costs = [evaluator.layers_run(start) for start in (ENCODER_STARTS, DECODER_STARTS, UNTOUCHED)]
    assert costs == [2 + 2 + 1, 2 + 1, 1]  # 2 encoder and 2 decoder layers, and the clean pass's share


SEQ2SEQ_TRAIN = ["data=translation_seq2seq", "size=smoke", "trainer.max_steps=2", "trainer.val_check_interval=2"]
SEQ2SEQ_TRAIN += ["logger=none", "ablation=[]", "model.encoder_layers=2", "model.n_layers=2", "model.d_model=32"]
SEQ2SEQ_TRAIN += ["model.n_ctx=16", "model.vocab_size=512", "model.attn.n_heads=4", "model.attn.n_kv_heads=2"]
SEQ2SEQ_TRAIN += ["trainer.progress_bar=false"]
SEQ2SEQ_SCANS = ["ablation=[single_head,layer,kv_groups,pairs,pruning,importance,attribution,l0_gates]"]
SEQ2SEQ_SCANS += ["ablation.batch_size=8", "ablation.masks_per_pass=3", "ablation.n_eval=24"]
SEQ2SEQ_SCANS += ["ablation.scans.l0_gates.l0.steps=3"]  # scans that evaluate no masks run whole in each process


@pytest.mark.slow  # 2.5 minutes on 2 loaded cores: a training and three scan processes
def test_headcount_ablate_on_two_processes_writes_an_encoder_decoder_s_tables_of_one(tmp_path):
    run = tmp_path / "run"
    proc = command([*SEQ2SEQ_TRAIN, f"hydra.run.dir={run}"], tmp_path, ["-m", "headcount.cli.train"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = copy_of(run, tmp_path / "one" / "run"), copy_of(run, tmp_path / "two" / "run")
    ablate(one, *SEQ2SEQ_SCANS)
    ablate(two, *SEQ2SEQ_SCANS, *TWO_PROCESSES)
    folder_one, folder_two = RunPaths(one).ablation, RunPaths(two).ablation
    csvs = sorted(p.name for p in folder_one.glob("*.csv"))
    assert csvs == [f"{scan}.csv" for scan in sorted(SEQ2SEQ_SCANS[0][10:-1].split(","))]
    assert sorted(p.name for p in folder_two.glob("*.csv")) == csvs
    for name in csvs:
        expected, got = pd.read_csv(folder_one / name), pd.read_csv(folder_two / name)
        pd.testing.assert_frame_equal(got, expected, check_exact=False, rtol=1e-6, atol=1e-7, obj=name)
    kv = pd.read_csv(folder_two / "kv_groups.csv")
    assert kv["mask"].tolist()[-2:] == ["cross.L1KV0", "cross.L1KV1"] and set(kv["kind"]) == {"enc", "dec", "cross"}

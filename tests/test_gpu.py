"""On a CUDA GPU, every exact computation gives the CPU's numbers: the converted families' forward against
transformers, the circuits (path patching, EAP, EAP-IG, exact edge scores, faithfulness) in float64 and float32, and
whole experiments at smoke size (training in bf16 with torch.compile, every scan on the GPU) against the same run on
the CPU. Skipped without CUDA (CI has none); run with `pytest -m gpu`."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from family_cases import hf_model
from omegaconf import OmegaConf

from headcount.ablation.records.address import result_folders
from headcount.api import load_run
from headcount.circuits import (
    Graph,
    eap_ig_scores,
    eap_scores,
    exact_edge_scores,
    faithfulness,
    path_patch,
    top_edges,
)
from headcount.cli.train import run
from headcount.config import validate_train_config
from headcount.pretrained.convert import convert
from headcount.run_dir import RunPaths

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

FAMILIES = ("gemma3", "gemma2", "olmo2", "llama3")  # tests/family_cases.py: post-norms, soft-caps, q/k norms, GQA
# float64 to 1e-6, not 1e-12: every family here has rotary positions, whose angles are float32 at every dtype (as in
# transformers, model/rotary.py), and CUDA's float32 sin/cos round differently from the CPU's (measured: 8e-8).
TOL = {torch.float64: 1e-6, torch.float32: 2e-4}


def prompts(vocab: int, batch: int = 3, T: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(0, vocab, (batch, T), generator=g)
    corrupted = clean.clone()
    corrupted[:, :-1] = torch.randint(0, vocab, (batch, T - 1), generator=g)
    return clean, corrupted


def logit_diff(logits_BV: torch.Tensor) -> torch.Tensor:
    return logits_BV[:, 3] - logits_BV[:, 7]


@pytest.mark.parametrize("family", FAMILIES)
def test_converted_model_on_cuda_equals_transformers(family):
    hf = hf_model(family).cuda()
    ours = convert(hf_model(family)).cuda().eval()
    ids = prompts(hf.config.get_text_config().vocab_size)[0].cuda()
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-4, rtol=1e-4)


def every_circuit_number(model, clean, corrupted) -> dict[str, torch.Tensor]:
    graph = Graph.of(model)
    edges = torch.linspace(0, len(graph.edges) - 1, 25).round().long().unique().tolist()
    eap = eap_scores(model, clean, corrupted, logit_diff)
    circuit = top_edges(graph, eap, len(graph.edges) // 3)
    pairs = [(["L0H0"], ["L1H1.q"]), (["L0H1", "L0.mlp"], ["L1H0.k", "L1H0.v"]), (["emb"], ["logits"])]
    return {
        "path_patch": path_patch(model, clean, corrupted, pairs, logit_diff),
        "eap": eap,
        "eap_ig": eap_ig_scores(model, clean, corrupted, logit_diff, steps=3),
        "exact": exact_edge_scores(model, clean, corrupted, logit_diff, edges=edges),
        "faithfulness": faithfulness(model, clean, corrupted, [circuit], logit_diff),
    }


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("family", FAMILIES)
def test_circuits_on_cuda_equal_the_cpu(family, dtype):
    model = convert(hf_model(family)).to(dtype).eval()
    clean, corrupted = prompts(model.cfg.vocab_size)
    on_cpu = every_circuit_number(model, clean, corrupted)
    on_gpu = every_circuit_number(model.cuda(), clean.cuda(), corrupted.cuda())
    for name, expected in on_cpu.items():
        assert expected.abs().max() > 1e-3, name  # numbers that move, so equality means something
        torch.testing.assert_close(
            on_gpu[name].cpu(), expected, atol=TOL[dtype], rtol=TOL[dtype], msg=lambda m, name=name: f"{name}: {m}"
        )


GPU_TRAINING = ["trainer.accelerator=gpu", "trainer.devices=1", "trainer.precision=bf16-mixed", "trainer.compile=true"]


def tables(run_dir: Path) -> dict[str, pd.DataFrame]:
    found = {}
    for folder in (results.folder for results in result_folders(run_dir / "ablation")):
        for csv in sorted(folder.glob("*.csv")):
            found[str(csv.relative_to(run_dir))] = pd.read_csv(csv)
    return found


def test_a_run_trains_in_bf16_with_compile_and_scans_on_the_gpu(compose_train, tmp_path):
    """induction_heads at smoke size on the GPU (bf16 autocast, torch.compile): it trains, its scans run on CUDA, and
    the trained checkpoint's head ablations on CUDA equal the CPU's."""
    cfg = compose_train(["experiment=induction_heads", "size=smoke", *GPU_TRAINING, "ablation.device=cuda"])
    validate_train_config(cfg)
    run(cfg, tmp_path)
    RunPaths(tmp_path).config.parent.mkdir(exist_ok=True)
    OmegaConf.save(cfg, RunPaths(tmp_path).config)  # what Hydra writes for headcount-train, which load_run reads
    assert np.isfinite(json.loads((tmp_path / "metrics.json").read_text())["val/loss"])
    assert tables(tmp_path)
    heads = [f"L{layer}H{head}" for layer in range(2) for head in range(4)]
    on_gpu, on_cpu = (load_run(tmp_path, device).evaluate(heads, mode="zero") for device in ("cuda", "cpu"))
    assert on_gpu["delta_loss"].abs().max() > 1e-3
    np.testing.assert_allclose(on_gpu["loss"], on_cpu["loss"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("experiment", ["ioi_circuit", "ioi_heads"])
def test_pretrained_experiments_scan_on_the_gpu_as_on_the_cpu(compose_train, tmp_path, experiment):
    """The pretrained experiments at smoke size (a tiny random Llama) give the same tables on CUDA as on the CPU."""
    found = {}
    for device in ("cuda", "cpu"):
        cfg = compose_train([f"experiment={experiment}", "size=smoke", f"ablation.device={device}"])
        validate_train_config(cfg)
        run(cfg, tmp_path / device)
        found[device] = tables(tmp_path / device)
    assert found["cuda"] and found["cuda"].keys() == found["cpu"].keys()
    for name, table in found["cuda"].items():
        numeric = table.select_dtypes("number").columns
        np.testing.assert_allclose(table[numeric], found["cpu"][name][numeric], rtol=1e-4, atol=1e-4, err_msg=name)

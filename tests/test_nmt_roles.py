"""Voita et al. 2019 on a translation model's encoder (findings/nmt_roles.py): EncoderDecoder.encoder_patterns equals
a hand computation of softmax(q k^T / sqrt(D)) over the unpadded keys (float64 and float32), L0 gates on the encoder
heads close every head under a large penalty and record when, each claim's verdict flips when its number is planted
on the other side, and a decoder-only run is refused in one line."""

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from headcount.ablation.methods.encoder_l0_gates import train_encoder_gates
from headcount.ablation.methods.translation_quality import loss_columns
from headcount.cli.train import run
from headcount.config.ablation import L0GatesConfig
from headcount.config.model import AttentionConfig, ModelConfig
from headcount.data.translation import translation_pairs
from headcount.errors import ConfigError
from headcount.findings import check_finding
from headcount.findings.nmt_roles import claims, encoder_roles
from headcount.model.encoder_decoder import EncoderDecoder
from headcount.run_dir import RunPaths

VOCAB = 512


def tiny(dtype: torch.dtype) -> EncoderDecoder:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=1, encoder_layers=2, d_model=16, vocab_size=VOCAB, n_ctx=32, attn=AttentionConfig(2))
    return EncoderDecoder(cfg).to(dtype).eval()


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_encoder_patterns_equal_a_hand_computation(dtype, tol):
    model = tiny(dtype)
    src = torch.randint(0, VOCAB, (3, 7))
    keep = torch.arange(7)[None] < torch.tensor([7, 4, 2])[:, None]
    patterns = model.encoder_patterns(src, keep)
    assert patterns.shape == (3, 2, 2, 7, 7)
    enc = model.encoder
    block = enc.blocks[0]
    x = block.ln_attn(enc.tok_emb(src) + enc.pos_emb(torch.arange(7)))
    q, k, _ = (x @ block.attn.qkv.weight.T + block.attn.qkv.bias).split(16, dim=-1)
    q, k = (t.view(3, 7, 2, 8).transpose(1, 2) for t in (q, k))  # (B, H, S, D)
    scores = (q @ k.transpose(-2, -1)) / 8**0.5
    hand = scores.masked_fill(~keep[:, None, None, :], float("-inf")).softmax(-1)
    torch.testing.assert_close(patterns[:, 0], hand.detach(), atol=tol, rtol=0)
    assert (patterns[~keep[:, None, None, None, :].expand_as(patterns)] == 0).all()  # no weight on padding
    torch.testing.assert_close(patterns.sum(-1), torch.ones_like(patterns.sum(-1)), atol=tol, rtol=0)


def test_encoder_roles_give_a_row_per_encoder_head():
    pairs = translation_pairs(np.random.default_rng(1), 20, VOCAB)
    roles, syntax = encoder_roles(tiny(torch.float64), pairs, batch_size=8)
    assert [(r.layer, r.head) for r in roles.itertuples()] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert ((roles.confidence > 0) & (roles.confidence <= 1)).all() and set(syntax.layer) == {0, 1}


def test_a_large_penalty_closes_every_encoder_head_and_records_when():
    model = tiny(torch.float32)
    pairs = translation_pairs(np.random.default_rng(1), 16, VOCAB)
    columns = {name: torch.as_tensor(a) for name, a in loss_columns(model, pairs).items()}
    cfg = L0GatesConfig(steps=40, lr=0.2)
    result = train_encoder_gates(model, [columns], cfg, penalty=10.0)
    assert result.keep_LH.sum() == 0 and len(result.task_loss) == 40
    assert ((result.survival_LH > 0) & (result.survival_LH < 1)).all()  # open at the start, closed by the end
    assert all(p.requires_grad for p in model.parameters()) and not model.training  # restored
    kept = train_encoder_gates(model, [columns], L0GatesConfig(steps=2, lr=0.01), penalty=0.0)
    assert kept.keep_LH.all() and (kept.survival_LH == 1).all()


def tables(positional=(True, False, False, False), syntactic=(False, True, False, False), rare=(0.1, 0.1, 0.9, 0.1),
           survival=(0.9, 0.8, 0.7, 0.2), deltas=(0.0, -0.2, -5.0)):  # fmt: skip
    roles = pd.DataFrame(
        {
            "layer": [0, 0, 1, 1],
            "head": [0, 1, 0, 1],
            "confidence": [0.9, 0.6, 0.7, 0.3],
            "positional": positional,
            "syntactic": syntactic,
            "rare_share": rare,
            "rare_chance": 0.1,
            "survival": survival,
        }
    )
    runs = pd.DataFrame({"penalty": [0.01, 0.03, 0.1], "n_kept": [4, 1, 0], "delta_bleu": deltas})
    runs = runs.assign(bleu=30 + runs.delta_bleu)
    return {"baseline": {"bleu": 30.0, "loss": 0.1, "sentences": 32}, "roles": roles, "gate_runs": runs}


def verdicts(t) -> list[str]:
    return [c.verdict for c in claims(t).claims]


def test_verdicts_on_known_tables():
    finding = claims(tables())
    assert verdicts(tables()) == ["reproduced"] * 3
    assert finding.numbers["heads_by_role"] == {"positional": ["enc.L0H0"], "syntactic": ["enc.L0H1"],
                                                "rare-word": ["enc.L1H0"]}  # fmt: skip
    assert finding.numbers["specialised_mean_survival"] == pytest.approx(0.8)
    assert finding.numbers["other_mean_survival"] == pytest.approx(0.2)
    assert finding.numbers["fewest_heads_within_1_bleu"] == 1 and finding.numbers["pruned_share_within_1_bleu"] == 0.75
    assert "confidence 0.90" in finding.claims[0].measured


def test_each_claim_flips_when_its_number_is_planted_wrong():
    # (1) no rare-word head (the rarest token at 0.4 < 0.5; at 0.15 < twice chance): two kinds of three
    assert verdicts(tables(rare=(0.1, 0.1, 0.4, 0.1)))[0] == "partly"
    assert verdicts(tables(rare=(0.1, 0.1, 0.15, 0.1)))[0] == "partly"
    assert verdicts(tables(positional=(False,) * 4, syntactic=(False,) * 4, rare=(0.1,) * 4))[0] == "not reproduced"
    # (2) an unspecialised head outlives them all: partly (the specialised still longer on average); on average too
    two_others = {"syntactic": (False,) * 4, "survival": (0.9, 0.95, 0.9, 0.1)}  # specialised: L0H0, L1H0
    assert verdicts(tables(**two_others))[1] == "partly"
    assert verdicts(tables(survival=(0.1, 0.2, 0.3, 0.95)))[1] == "not reproduced"
    assert verdicts(tables(positional=(False,) * 4, syntactic=(False,) * 4, rare=(0.1,) * 4))[1] == "not reproduced"
    # (3) one head pruned within 1 BLEU: partly; none: not reproduced
    t = tables()
    t["gate_runs"] = t["gate_runs"].assign(n_kept=[3, 1, 0], delta_bleu=[0.0, -2.0, -5.0])
    assert verdicts(t)[2] == "partly"
    assert verdicts(tables(deltas=(-1.5, -2.0, -5.0)))[2] == "not reproduced"


def test_a_decoder_only_run_is_refused_in_one_line(compose_train, tmp_path):
    cfg = compose_train(["experiment=nmt_roles", "size=smoke", "model=nmt_small", "data=translation"])
    run(cfg, tmp_path)
    RunPaths(tmp_path).config.parent.mkdir(exist_ok=True)
    OmegaConf.save(cfg, RunPaths(tmp_path).config)
    with pytest.raises(ConfigError) as error:
        check_finding("nmt_roles", tmp_path)
    assert (
        str(error.value) == "data.source='translation': finding nmt_roles needs data=translation_seq2seq (an encoder)"
    )
    assert not (tmp_path / "findings" / "findings.json").exists()

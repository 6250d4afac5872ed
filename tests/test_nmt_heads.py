"""Michel et al. 2019 on a translation model (findings/nmt_heads.py, findings/translation_heads.py): verdicts on tables
with known answers (each claim flips when its number is planted on the other side), the prunable fraction, and the
measurements on a tiny random model: Michel's importance equals central finite differences of each example's loss in
its gate, a pruning curve starts at the full model and single-head rows are that head's gates at 0."""

import numpy as np
import pandas as pd
import pytest
import torch

from headcount.config.model import AttentionConfig, ModelConfig
from headcount.data.translation import SEQUENCE, as_sequences, translation_pairs
from headcount.findings.nmt_heads import claims
from headcount.findings.translation_heads import (
    TranslationModel,
    head_rows,
    importance,
    prunable_fraction,
    pruning_curve,
    single_heads,
    with_off,
)
from headcount.model.intervention import gated
from headcount.model.transformer import Transformer

VOCAB = 512
KINDS = {"enc": (2, 2), "dec": (2, 2), "cross": (2, 2)}


def curve(order: str, bleus: list[float]) -> pd.DataFrame:
    n = len(bleus) - 1
    return pd.DataFrame({"order": order, "n_pruned": range(n + 1), "fraction": np.arange(n + 1) / n, "bleu": bleus})


def tables(cross_bleus=(30, 29.5, 20, 10, 5), single_drops=(0.1, 0.2, 3.0), one_best=0.5, random_bleus=None):
    """Baseline BLEU 30; each kind's curve over 4 heads; 'all' over 12; single-head drops cycled over the heads."""
    rows = head_rows(KINDS)
    drops = [single_drops[i % len(single_drops)] for i in range(len(rows))]
    single = pd.DataFrame(rows, columns=["kind", "layer", "head"]).assign(delta_bleu=[-d for d in drops])
    one = pd.DataFrame(rows, columns=["kind", "layer", "head"]).assign(delta_bleu=-5.0)
    one.loc[one["head"] == 0, "delta_bleu"] = -one_best
    all_bleus = [30] * 4 + [25] * 9  # 3 of 12 within 1 BLEU: 25%
    random_bleus = random_bleus or [30, 29.5] + [10] * 11  # 1 of 12: 8%
    pruning = pd.concat(
        [
            curve("enc", [30, 30, 29.8, 29.5, 20]),  # 75%
            curve("dec", [30, 30, 29.9, 15, 10]),  # 50%
            curve("cross", list(cross_bleus)),  # 25%
            curve("all", all_bleus),
            curve("random", random_bleus),
        ]
    )
    base = {"bleu": 30.0, "loss": 0.1, "exact": 0.9, "sentences": 64}
    return {"baseline": base, "single_head": single, "pruning": pruning, "one_head": one}


def verdicts(t) -> list[str]:
    return [c.verdict for c in claims(t).claims]


def test_verdicts_on_known_tables():
    finding = claims(tables())
    assert [c.verdict for c in finding.claims] == ["reproduced"] * 4
    assert finding.numbers["prunable_fraction"] == {"enc": 0.75, "dec": 0.5, "cross": 0.25, "all": 0.25,
                                                    "random": 1 / 12}  # fmt: skip
    assert finding.numbers["share_of_heads_under_1_bleu"] == pytest.approx(2 / 3)
    assert finding.numbers["layers_fine_with_one_head"] == 6


def test_each_claim_flips_when_its_number_is_planted_wrong():
    # (a) most heads cost 3 BLEU alone
    assert verdicts(tables(single_drops=(0.1, 3.0, 3.0)))[0] == "partly"
    assert verdicts(tables(single_drops=(3.0,)))[0] == "not reproduced"
    # (b) random prunes as much as importance order
    assert verdicts(tables(random_bleus=[30] * 4 + [10] * 9))[1] == "not reproduced"
    # (c) cross-attention the most robust kind: prunable 100%
    assert verdicts(tables(cross_bleus=(30, 30, 30, 30, 30)))[2] == "not reproduced"
    # (c) tied with the least prunable other kind: partly
    assert verdicts(tables(cross_bleus=(30, 30, 29.5, 15, 10)))[2] == "partly"
    # (d) no layer keeps its BLEU with one head
    assert verdicts(tables(one_best=2.0))[3] == "not reproduced"


def test_a_decoder_only_model_cannot_test_the_cross_attention_claim():
    t = tables()
    t["single_head"] = t["single_head"].assign(kind="dec")
    t["one_head"] = t["one_head"][t["one_head"].kind == "dec"]
    t["pruning"] = t["pruning"][t["pruning"].order.isin(["dec", "random"])]
    claim = claims(t).claims[2]
    assert claim.verdict == "not reproduced" and "not testable" in claim.measured


def test_prunable_fraction():
    assert prunable_fraction(curve("x", [30, 29.5, 28, 29.9, 10]), 30, 1.0) == 0.25  # stops at the first drop
    assert prunable_fraction(curve("x", [30, 30, 30]), 30, 1.0) == 1.0
    assert prunable_fraction(curve("x", [30, 20, 30]), 30, 1.0) == 0.0


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=2, d_model=32, vocab_size=VOCAB, n_ctx=SEQUENCE, attn=AttentionConfig(2), mlp=True)
    model = Transformer(cfg).double().eval()
    return TranslationModel.of(model, batch_size=8), translation_pairs(np.random.default_rng(1), 12, VOCAB)


def test_importance_is_the_mean_absolute_finite_difference(tiny):
    model, pairs = tiny
    grads = model.gate_gradients(pairs)["dec"]  # (examples, layers, heads)
    ids, mask = (torch.as_tensor(a) for a in as_sequences(pairs, SEQUENCE))

    @torch.no_grad()
    def example_loss(x: int, gates: torch.Tensor) -> float:
        logits = model.model(ids[x : x + 1], gated(gates))[0, :-1]
        losses = torch.nn.functional.cross_entropy(logits, ids[x, 1:], reduction="none")
        return float(losses[mask[x, 1:]].mean())

    eps = 1e-5
    for x in (0, 5):
        for layer, head in ((0, 1), (1, 0)):
            up, down = torch.ones(2, 2, dtype=torch.float64), torch.ones(2, 2, dtype=torch.float64)
            down[layer, head] = 1 - 2 * eps  # gates stay in [0, 1]: a one-sided step of 2 eps
            fd = (example_loss(x, up) - example_loss(x, down)) / (2 * eps)
            assert grads[x, layer, head] == pytest.approx(fd, rel=1e-4, abs=1e-7)
    scores = importance(model, pairs)
    expected = np.abs(grads).mean(axis=0)
    assert np.allclose(scores.importance.to_numpy().reshape(2, 2), expected)
    assert np.allclose(np.linalg.norm(scores.normalised.to_numpy().reshape(2, 2), axis=1), 1.0)


def test_curves_and_single_heads_are_gated_models(tiny):
    model, pairs = tiny
    base = model.quality(pairs)
    order = [("dec", 1, 0), ("dec", 0, 1)]
    c = pruning_curve(model, pairs, order, "dec")
    assert c.bleu.iloc[0] == base.bleu and c.loss.iloc[0] == base.loss
    both_off = torch.ones(2, 2, dtype=torch.float32)
    both_off[1, 0] = both_off[0, 1] = 0
    assert c.loss.iloc[2] == model.quality(pairs, {"dec": both_off}).loss
    assert with_off(model, order)["dec"].tolist() == both_off.tolist()
    single = single_heads(model, pairs, base)
    assert len(single) == 4
    off = model.quality(pairs, with_off(model, [("dec", 1, 1)]))
    last = single.iloc[3]
    assert (last.layer, last["head"]) == (1, 1) and last.delta_loss == pytest.approx(off.loss - base.loss)

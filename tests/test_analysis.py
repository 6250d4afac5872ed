"""Head pattern scores against a loop written straight from their definitions."""

import torch

from headcount.ablation.scans.head_scores import head_pattern_scores
from headcount.model import AttentionConfig, ModelConfig, Transformer
from headcount.model.intervention import reads


def reference_scores(model, ids_BT):
    cache = reads(["attn.pattern"], range(model.n_layers))
    model(ids_BT, cache)
    B, T = ids_BT.shape
    out = {}
    for layer in range(model.n_layers):
        pattern = cache.read("attn.pattern", layer)
        for head in range(model.max_heads):
            prev = [pattern[b, head, t, t - 1].item() for b in range(B) for t in range(1, T)]
            induction = []
            for b in range(B):
                for t in range(T):
                    targets = [s for s in range(1, t + 1) if ids_BT[b, s - 1] == ids_BT[b, t]]
                    if targets:
                        induction.append(sum(pattern[b, head, t, s].item() for s in targets))
            out[layer, head] = (sum(prev) / len(prev), sum(induction) / len(induction))
    return out


def test_scores_match_their_definitions():
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=2, d_model=16, n_ctx=16, vocab_size=6, attn=AttentionConfig(n_heads=2), mlp=True)
    model = Transformer(cfg)
    ids = torch.randint(0, 6, (3, 10), generator=torch.Generator().manual_seed(1))
    scores = head_pattern_scores(model, [{"input_ids": ids[:2]}, {"input_ids": ids[2:]}])
    expected = reference_scores(model, ids)
    for row in scores.itertuples():
        prev, induction = expected[row.layer, row.head]
        assert abs(row.prev_token_score - prev) < 1e-6
        assert abs(row.induction_score - induction) < 1e-6
    assert len(scores) == 4

"""An encoder-decoder's head scores by kind (ablation/methods/seq2seq_head_scores.py): the generator's alignment maps
each target word to the source word it translates (checked on the words' lemmas); planted attention patterns score 1
where they attend (previous token, next token, induction target, aligned source word) and a uniform pattern its share;
on a tiny random model every score equals a count by hand over its own patterns, and cross-attention's recomputed
pattern gives the forward's z; the scan names kinds, leaves NaN where a kind's attention defines no score and says
why."""

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf
from seq2seq_cases import pairs, tiny_seq2seq
from test_seq2seq_scans import trained  # noqa: F401 (a fixture: a tiny encoder-decoder trained on translation)

from headcount.ablation.methods import seq2seq_head_scores as scores_module
from headcount.ablation.methods.seq2seq_head_scores import (
    cross_attention,
    decoder_tokens,
    kind_patterns,
    seq2seq_head_scores,
)
from headcount.data.translation import (
    ADJ,
    DET,
    EOS,
    NOUN,
    PREP,
    VERB,
    Lexicon,
    as_seq2seq,
    target_alignment,
    translation_pairs,
)
from headcount.model.transformer import Memory

VOCAB = 512
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}  # the forward's attention is SDPA's, the recomputed explicit


def test_the_alignment_maps_each_target_word_to_the_source_word_it_translates():
    pairs_ = translation_pairs(np.random.default_rng(3), 200, VOCAB)
    lex, aligned = Lexicon.for_vocab(VOCAB), target_alignment(pairs_)
    # the lemma (and number) each class's id carries, in the source's and in the target's id layout
    source_lemma = {DET: lambda s: (s - lex.src_det) // 2, NOUN: lambda s: s - lex.src_noun,
                    ADJ: lambda s: s - lex.src_adj, VERB: lambda s: (s - lex.src_verb) // 2,
                    PREP: lambda s: s - lex.src_prep}  # fmt: skip
    target_lemma = {DET: lambda t: (t - lex.tgt_det) // 4, NOUN: lambda t: t - lex.tgt_noun,
                    ADJ: lambda t: (t - lex.tgt_adj) // 2, VERB: lambda t: (t - lex.tgt_verb) // 4,
                    PREP: lambda t: t - lex.tgt_post}  # fmt: skip
    checked = 0
    for row in range(len(pairs_.source)):
        n = int(pairs_.target_lengths[row])
        assert (aligned[row, : n - 1] >= 0).all() and (aligned[row, n - 1 :] == -1).all()  # EOS and padding: none
        assert sorted(aligned[row, : n - 1]) == list(range(n - 1))  # every source word translated once
        for t in range(n - 1):
            s = aligned[row, t]
            role = int(pairs_.roles[row, s])
            assert target_lemma[role](pairs_.target[row, t]) == source_lemma[role](pairs_.source[row, s]), (row, t)
            checked += 1
    assert checked > 1000


def one_hot(keys_BQ: torch.Tensor, n_keys: int) -> torch.Tensor:
    """(B, 1, Q, K) patterns with all of query q's attention on key keys_BQ[b, q] (clamped into range)."""
    pattern = torch.zeros(*keys_BQ.shape, n_keys, dtype=torch.float64)
    pattern.scatter_(2, keys_BQ.clamp(0, n_keys - 1)[..., None], 1.0)
    return pattern[:, None]


def translation_batch(n: int = 40, seed: int = 4) -> tuple[dict, torch.Tensor]:
    """n generated pairs as an encoder-decoder's batch, and (B, T) each decoder position's aligned source word."""
    pairs_ = translation_pairs(np.random.default_rng(seed), n, VOCAB)
    batch = {key: torch.as_tensor(value) for key, value in as_seq2seq(pairs_, 16).items()}
    aligned = torch.full(batch["input_ids"].shape, -1, dtype=torch.long)
    aligned[:, : pairs_.target.shape[1]] = torch.as_tensor(target_alignment(pairs_))
    return batch, aligned


def test_planted_patterns_score_one_where_they_attend_and_a_uniform_one_its_share(monkeypatch):
    """Two heads per kind: a planted one (encoder previous- then next-token, decoder previous-token and induction,
    cross-attention on the aligned word) and a uniform one; kind_patterns is replaced by them."""
    model = tiny_seq2seq(torch.float64)  # its shape only: 2 layers of each kind
    batch, aligned = translation_batch()
    B, S = batch["src_ids"].shape
    T = batch["input_ids"].shape[1]
    q_S, q_T = torch.arange(S).expand(B, S), torch.arange(T).expand(B, T)
    ids = batch["input_ids"]
    # induction: the position after the last earlier occurrence of this position's token (else the start)
    earlier = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        for t in range(T):
            found = [s + 1 for s in range(t) if ids[b, s] == ids[b, t] and s + 1 <= t]
            earlier[b, t] = found[-1] if found else 0
    source_keep, target_keep = batch["src_mask"], decoder_tokens(batch)

    def uniform(keep_BK: torch.Tensor, Q: int, causal: bool) -> torch.Tensor:
        allowed = keep_BK[:, None, :].expand(B, Q, -1).clone()
        if causal:
            allowed &= torch.ones(Q, Q, dtype=torch.bool).tril()
        allowed[:, :, 0] |= ~allowed.any(-1)
        return (allowed.double() / allowed.sum(-1, keepdim=True))[:, None]

    planted = {
        "enc": [torch.cat([one_hot(q_S - 1, S), uniform(source_keep, S, False)], 1),
                torch.cat([one_hot(q_S + 1, S), uniform(source_keep, S, False)], 1)],
        "dec": [torch.cat([one_hot(q_T - 1, T), uniform(target_keep, T, True)], 1),
                torch.cat([one_hot(earlier, T), uniform(target_keep, T, True)], 1)],
        "cross": [torch.cat([one_hot(aligned, S), uniform(source_keep, T, False)], 1)] * 2,
    }  # fmt: skip
    monkeypatch.setattr(scores_module, "kind_patterns", lambda model, batch: planted)
    got = seq2seq_head_scores(model, [batch], [aligned])
    assert got["enc"]["prev_token_score"][0, 0] == 1.0 and got["enc"]["next_token_score"][1, 0] == 1.0
    assert got["dec"]["prev_token_score"][0, 0] == 1.0 and got["dec"]["induction_score"][1, 0] == 1.0
    assert (got["cross"]["alignment_score"][:, 0] == 1.0).all()
    for kind, score, layer in [("enc", "prev_token_score", 0), ("dec", "prev_token_score", 0),
                               ("cross", "alignment_score", 0), ("enc", "next_token_score", 1)]:  # fmt: skip
        assert got[kind][score][layer, 1] < 0.35, (kind, score)  # a uniform head: about 1 / length
    # the source's mean length is about 9: a uniform head puts 1 / length on the aligned word
    lengths = source_keep.sum(1).double()
    per_position = (aligned >= 0).sum(1).double()
    share = float((per_position / lengths).sum() / per_position.sum())
    assert got["cross"]["alignment_score"][0, 1] == pytest.approx(share, abs=1e-12)
    assert got["enc"]["prev_token_score"][1, 0] < 0.05  # a next-token head is no previous-token head


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_recomputed_cross_attention_gives_the_forward_s_z_and_scores_equal_a_count_by_hand(dtype):
    model, batch = tiny_seq2seq(dtype), pairs()
    cache = {}
    with torch.no_grad():
        model(batch["src_ids"], batch["input_ids"], src_keep=batch["src_mask"], cache=cache)
        memory = model.encode(batch["src_ids"], src_keep=batch["src_mask"])
        cross = model.decoder.cross_input(Memory(memory, batch["src_mask"]), dtype)
        stream = model.decoder.embed(batch["input_ids"])
        for layer, block in enumerate(model.decoder.blocks):
            mid = block.add_attn(stream, block.attn.combine_heads(block.attn.heads(block.ln_attn(stream))))
            z, pattern = cross_attention(block, mid, cross)
            torch.testing.assert_close(z, cache[f"dec.blocks.{layer}.cross.z"], rtol=0, atol=TOLERANCE[dtype])
            assert pattern[~batch["src_mask"][:, None, None, :].expand_as(pattern)].abs().max() == 0  # padding
            stream = block(stream, cross=cross)
    g = torch.Generator().manual_seed(0)
    aligned = torch.randint(-1, batch["src_ids"].shape[1], batch["input_ids"].shape, generator=g)
    aligned[~batch["src_mask"].gather(1, aligned.clamp_min(0))] = -1  # aligned to real source words only
    got = seq2seq_head_scores(model, [batch], [aligned])
    patterns = kind_patterns(model, batch)
    hand = {kind: {} for kind in ("enc", "dec", "cross")}
    src_keep, ids = batch["src_mask"], batch["input_ids"]
    tgt_keep = torch.cat([torch.ones(len(ids), 1, dtype=torch.bool), batch["loss_mask"][:, 1:]], 1)  # start, targets

    def mean_over(points, kind, layer, head):
        values = [float(patterns[kind][layer][b, head, q, k]) for b, q, k in points]
        return sum(values) / len(values)

    B, S, T = len(ids), src_keep.shape[1], ids.shape[1]
    neighbours = {
        ("enc", "prev_token_score"): [(b, q, q - 1) for b in range(B) for q in range(1, S) if src_keep[b, q]],
        ("enc", "next_token_score"): [(b, q, q + 1) for b in range(B) for q in range(S - 1) if src_keep[b, q + 1]],
        ("dec", "prev_token_score"): [(b, q, q - 1) for b in range(B) for q in range(1, T) if tgt_keep[b, q]],
        ("cross", "alignment_score"): [(b, q, int(aligned[b, q])) for b in range(B) for q in range(T)
                                       if aligned[b, q] >= 0],
    }  # fmt: skip
    for (kind, score), points in neighbours.items():
        for layer in range(2):
            for head in range(model.head_kinds[kind][1]):
                hand = mean_over(points, kind, layer, head)
                assert float(got[kind][score][layer, head]) == pytest.approx(hand, abs=1e-6), (kind, score)
    # induction: every earlier key whose previous token is this position's token, summed per position
    for layer in range(2):
        for head in range(3):
            totals = []
            for b in range(B):
                for t in range(T):
                    keys = [s for s in range(1, t + 1) if tgt_keep[b, s - 1] and ids[b, s - 1] == ids[b, t]]
                    if tgt_keep[b, t] and keys:
                        totals.append(sum(float(patterns["dec"][layer][b, head, t, s]) for s in keys))
            expected = sum(totals) / len(totals)
            assert float(got["dec"]["induction_score"][layer, head]) == pytest.approx(expected, abs=1e-6)


def test_head_scores_scan_on_a_trained_encoder_decoder_names_kinds_and_leaves_undefined_scores_nan(trained):  # noqa: F811
    import headcount
    from headcount.ablation.methods.seq2seq_head_scores import NOT_DEFINED
    from headcount.ablation.scans.head_scores import translation_alignments

    run = headcount.load_run(trained, device="cpu")
    table = run.scan("head_scores")
    assert list(table.columns[:7]) == ["kind", "layer", "head", "prev_token_score", "next_token_score",
                                       "induction_score", "alignment_score"]  # fmt: skip
    assert table["kind"].value_counts().to_dict() == {"enc": 4, "dec": 4, "cross": 4}
    batches = run.finished.eval_batches()
    a = run.config.ablation
    alignments, missing = translation_alignments(run.config.data, a.split, a.n_eval, batches)
    assert missing is None
    none, why = translation_alignments(OmegaConf.create({"source": "induction"}), a.split, a.n_eval, batches)
    assert none is None and why == (
        "data.source=induction: only data.source=translation_seq2seq knows each word's alignment"
    )
    lex = Lexicon.for_vocab(run.config.data.vocab_size)
    nouns = 0
    for batch, aligned in zip(batches, alignments):  # position t predicts word t + 1: aligned to that word's source
        ids, marked = batch["input_ids"], batch["loss_mask"].bool()
        words = torch.zeros_like(marked)
        words[:, :-1] = marked[:, 1:] & (ids[:, 1:] != EOS)
        assert torch.equal(aligned >= 0, words)
        for b, t in (aligned >= 0).nonzero().tolist():
            source = int(batch["src_ids"][b, aligned[b, t]])
            if lex.tgt_noun <= ids[b, t + 1] < lex.tgt_adj:
                assert ids[b, t + 1] - lex.tgt_noun == source - lex.src_noun
                nouns += 1
    assert nouns > 20
    expected = seq2seq_head_scores(run.model, batches, alignments)
    defined = {"enc": {"prev_token_score", "next_token_score"}, "dec": {"prev_token_score", "induction_score"},
               "cross": {"alignment_score"}}  # fmt: skip
    for row in table.itertuples():
        for score in ("prev_token_score", "next_token_score", "induction_score", "alignment_score"):
            value = getattr(row, score)
            if score in defined[row.kind]:
                assert value == pytest.approx(float(expected[row.kind][score][row.layer, row.head]), abs=1e-9)
                assert 0 <= value <= 1
            else:
                assert pd.isna(value), (row.kind, score)
    import json

    summary = json.loads((trained / "ablation" / "summary.json").read_text())
    not_defined = summary["mode_independent"]["not_defined"]["head_scores"]  # one result for every mode
    assert not_defined["enc"]["induction_score"] == NOT_DEFINED["induction_score"]
    assert set(not_defined["cross"]) == {"prev_token_score", "next_token_score", "induction_score"}
    for score in ("prev_token_score", "next_token_score", "induction_score", "alignment_score"):
        assert (trained / "ablation" / f"head_scores_{score}.png").exists()

"""In-context copying on repeated random tokens (Olsson et al. 2022): a sequence of random tokens followed by the same
tokens again. The first half is unpredictable; a model with induction heads predicts the repeat from its first
occurrence. The head_scores scan's induction score on these sequences finds the heads that do it, and the probe
measures what ablating the top k of them, or k random heads, costs on the repeated half."""

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from headcount.ablation.engine.evaluator import MaskEvaluator
from headcount.ablation.engine.heads import all_heads
from headcount.ablation.engine.masks import HeadMask, joined_name, masks_to_gates
from headcount.ablation.scans.head_scores import head_pattern_scores, head_pattern_sums
from headcount.circuits.bootstrap import RESAMPLES, resample_counts, top_n_stability
from headcount.model import Transformer

# Token ids are drawn from the top 15/16 of the vocabulary: low ids are the special tokens (and bytes) of most
# tokenizers, which a real model was never shown mid-text.
LOW_ID_SHARE = 1 / 16


@dataclass
class CopyingProbe:
    heads: pd.DataFrame  # layer, head, prev_token_score, induction_score on the repeated sequences
    first_half_loss: float  # nats per token where nothing can be copied
    repeated_loss: float  # nats per token on the repeat, all heads on
    top_k: list[tuple[int, int]]  # the k heads with the highest induction score
    top_k_loss: float  # the repeat's loss with them zeroed
    random_k_losses: list[float]  # the repeat's loss with k random heads zeroed, one per draw
    # how stable the top k by induction score are over bootstrap resamples of the sequences (findings/stability.py's
    # entry: top_n, resamples, mean_overlap, min_overlap); None where not asked for
    top_k_stability: dict | None = None


def repeated_random_batches(vocab_size: int, n: int, half: int, batch_size: int, seed: int) -> list[dict[str, Tensor]]:
    """n sequences of `half` random tokens and the same tokens again, scored on the repeat after its first token (the
    first token of the repeat has no cue yet)."""
    rng = np.random.default_rng(seed)
    low = int(vocab_size * LOW_ID_SHARE)
    first_NH = torch.from_numpy(rng.integers(low, vocab_size, (n, half)))
    ids_NT = torch.cat([first_NH, first_NH], dim=1)
    mask_NT = torch.zeros_like(ids_NT, dtype=torch.bool)
    mask_NT[:, half + 1 :] = True
    return [
        {"input_ids": ids_NT[i : i + batch_size], "loss_mask": mask_NT[i : i + batch_size]}
        for i in range(0, n, batch_size)
    ]


def first_half(batches: list[dict[str, Tensor]]) -> list[dict[str, Tensor]]:
    """The same sequences scored on their first half (tokens 1..half-1): what no copying can predict."""
    half = batches[0]["input_ids"].shape[1] // 2
    scored = []
    for batch in batches:
        mask_BT = torch.zeros_like(batch["loss_mask"])
        mask_BT[:, 1:half] = True
        scored.append({**batch, "loss_mask": mask_BT})
    return scored


def copying_probe(
    model: Transformer, batches: list[dict[str, Tensor]], k: int, draws: int, seed: int, stability: bool = False
) -> CopyingProbe:
    """Induction scores on `batches` (repeated_random_batches), then the repeat's loss with the top k heads by score
    zeroed and with k random heads zeroed (`draws` draws, seeded); stability: also the top k's stability over
    resamples of the sequences (one more pass, a sequence at a time)."""
    heads = head_pattern_scores(model, batches)
    evaluator = MaskEvaluator(model, batches)
    ranked = heads.sort_values(["induction_score", "layer", "head"], ascending=[False, True, True], kind="stable")
    top_k = [(int(row.layer), int(row.head)) for row in ranked.head(k).itertuples()]
    every = all_heads(model.heads_per_layer)
    rng = np.random.default_rng(seed)
    random_sets = [[every[i] for i in rng.choice(len(every), k, replace=False)] for _ in range(draws)]
    masks = [HeadMask(joined_name(tuple(chosen)), tuple(chosen)) for chosen in [top_k, *random_sets]]
    gates_MLH = masks_to_gates(masks, model.heads_per_layer)
    losses = evaluator.evaluate(gates_MLH)["loss"].tolist()
    return CopyingProbe(
        heads=heads,
        first_half_loss=MaskEvaluator(model, first_half(batches)).baseline()["loss"],
        repeated_loss=evaluator.baseline()["loss"],
        top_k=top_k,
        top_k_loss=losses[0],
        random_k_losses=losses[1:],
        top_k_stability=induction_score_stability(model, batches, k, seed) if stability else None,
    )


def induction_score_stability(model: Transformer, batches: list[dict[str, Tensor]], k: int, seed: int) -> dict:
    """How stable the top k heads by induction score are over bootstrap resamples of the sequences."""
    sums_PK, points_P = per_sequence_induction(model, batches)
    resamples = resample_counts(len(points_P), RESAMPLES, seed)
    stable = top_n_stability(sums_PK, points_P, resamples, k, magnitude=False)
    return {"top_n": k, "resamples": RESAMPLES} | {key: stable[key] for key in ("mean_overlap", "min_overlap")}


def per_sequence_induction(model: Transformer, batches: list[dict[str, Tensor]]) -> tuple[Tensor, Tensor]:
    """(P, K) each sequence's attention on induction targets summed over its positions that have one, and (P,) the
    count of those positions: a head's induction score over all sequences is the sums' total over the counts'. Kept
    per sequence by the batched forward that computes the scores (head_scores.head_pattern_sums): no pass per
    sequence."""
    return head_pattern_sums(model, batches)["induction_score"]

"""What BERT's heads look at (Clark et al. 2019), on all-MiniLM-L6-v2 (experiment clark_attention: 6 layers x 12
heads, evaluated as it is on English essays in its own tokenizer).

Each evaluation chunk becomes a BERT input pair, [CLS] A [SEP] B [SEP] (A and B its two halves, token types 0 and 1),
and every head's attention pattern is read on it. Per head, the mean over examples and query positions of:
- its attention mass on [CLS] and on the two [SEP] tokens;
- its attention to the previous and to the next token (over the queries that have one);
- the entropy of its attention distribution (nats; a uniform one over T keys has log T).

MiniLM is a sentence-embedding model with no masked-LM head, so a head's ablation is measured on what the model is
for: 1 - the cosine similarity between the mean-pooled sentence embedding (sentence-transformers' pooling, over every
token) with the head zeroed and without, the mean over examples.

The claims (each verdict a function of these maps, `claims`, so it can be tested on made-up numbers):
(1) some heads put most of their attention on [SEP]; (2) attention to [CLS] is largest in the early layers;
(3) some heads attend to the previous token, and some to the next, with most of their attention; (4) early layers
attend broadly (the highest mean entropy); (5) attention to the special tokens acts as a no-op: the heads that mostly
attend to [CLS] and [SEP] change the output less, when zeroed, than the other heads (Clark et al. argue it for [SEP],
from gradients; here, by zeroing, on both special tokens, as MiniLM's heads park their attention on [CLS]).
"""

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from headcount.captions import describe_run
from headcount.findings.claims import FINDINGS, Claim, Finding, FindingChecker, verdict
from headcount.model.intervention import gated, reads
from headcount.model.transformer import Transformer
from headcount.plotting import head_heatmap
from headcount.run_dir import load_run

PAPER = "Clark et al. 2019, What Does BERT Look At? An Analysis of BERT's Attention"
MOST = 0.5  # "most of its attention": over half of a head's attention mass
MIN_GROUP = 3  # fewer heads than this on the special tokens: a median of them reads "partly" at best
MEASURES = {
    "cls": "attention to [CLS]",
    "sep": "attention to [SEP]",
    "previous": "attention to the previous token",
    "next": "attention to the next token",
    "entropy": "attention entropy (nats)",
    "cost": "1 - cos(sentence embedding), head zeroed",
}


@dataclass
class HeadMaps:
    """Each measure as an (L, H) float64 array, and the sequence length T the patterns span."""

    maps: dict[str, np.ndarray]
    T: int


def bert_pairs(ids_NT: Tensor, cls_id: int, sep_id: int) -> tuple[Tensor, Tensor]:
    """(inputs, token types), both (N, T): [CLS] A [SEP] B [SEP], A and B the two halves of each chunk's first T - 3
    tokens (the chunk's length T kept)."""
    N, T = ids_NT.shape
    body_NT = ids_NT[:, : T - 3]
    half = (T - 3) // 2
    cls_N1, sep_N1 = torch.full((N, 1), cls_id), torch.full((N, 1), sep_id)
    inputs_NT = torch.cat([cls_N1, body_NT[:, :half], sep_N1, body_NT[:, half:], sep_N1], 1)
    types_NT = torch.zeros_like(inputs_NT)
    types_NT[:, half + 2 :] = 1
    return inputs_NT, types_NT


def sentence_embedding(model: Transformer, final_BTC: Tensor) -> Tensor:
    """Mean pooling over every token of the last hidden state (the final norm where the model has one)."""
    return model.ln_f(final_BTC).mean(1).double()


@torch.no_grad()
def head_maps(model: Transformer, inputs_NT: Tensor, types_NT: Tensor, batch_size: int) -> HeadMaps:
    """Every measure of the module docstring for every head, over the N inputs in batches of batch_size."""
    model = model.eval()
    L, H, T = model.n_layers, model.max_heads, inputs_NT.shape[1]
    sums = {name: torch.zeros(L, H, dtype=torch.float64) for name in MEASURES}
    sep_a = (T - 3) // 2 + 1  # the first [SEP]'s position; the second is the last
    for start in range(0, len(inputs_NT), batch_size):
        ids_BT, types_BT = inputs_NT[start : start + batch_size], types_NT[start : start + batch_size]
        read = reads(["resid_pre", "attn.pattern"], range(L))
        final_BTC = model.forward_layers(model.embed(ids_BT, types_BT), 0, read)
        clean_BE = sentence_embedding(model, final_BTC)
        for layer in range(L):
            p_BHTT = read.read("attn.pattern", layer).double()
            h = p_BHTT.shape[1]
            sums["cls"][layer, :h] += p_BHTT[..., 0].mean(2).sum(0)
            sums["sep"][layer, :h] += (p_BHTT[..., sep_a] + p_BHTT[..., T - 1]).mean(2).sum(0)
            sums["previous"][layer, :h] += p_BHTT.diagonal(-1, 2, 3).mean(2).sum(0)
            sums["next"][layer, :h] += p_BHTT.diagonal(1, 2, 3).mean(2).sum(0)
            logs = torch.where(p_BHTT > 0, p_BHTT.log(), torch.zeros_like(p_BHTT))
            sums["entropy"][layer, :h] += (-(p_BHTT * logs).sum(3)).mean(2).sum(0)
            for head in range(h):  # zeroed alone, from the stream before its layer
                gates = torch.ones(L, H, dtype=final_BTC.dtype)
                gates[layer, head] = 0
                final = model.forward_layers(read.read("resid_pre", layer), layer, gated(gates, start=layer))
                cos_B = torch.nn.functional.cosine_similarity(sentence_embedding(model, final), clean_BE, dim=1)
                sums["cost"][layer, head] += (1 - cos_B).sum()
    return HeadMaps({name: (total / len(inputs_NT)).numpy() for name, total in sums.items()}, T)


def layer_means(values_LH: np.ndarray) -> np.ndarray:
    return values_LH.mean(1)


def sep_claim(m: HeadMaps) -> tuple[Claim, dict]:
    sep = m.maps["sep"]
    n_most, uniform = int((sep > MOST).sum()), 2 / m.T
    layer = int(np.argmax(layer_means(sep)))
    measured = (
        f"{n_most} of {sep.size} heads put over {MOST:.0%} of their attention on the two [SEP] tokens (at most "
        f"{sep.max():.2f}; a uniform head would put {uniform:.3f}); layer {layer} the most on average "
        f"({layer_means(sep)[layer]:.2f})"
    )
    claim = Claim(
        "Some heads put most of their attention on [SEP]", measured, verdict(n_most >= 1, sep.max() > 5 * uniform)
    )
    return claim, {
        "sep_heads_over_half": n_most,
        "sep_max": float(sep.max()),
        "sep_layer_means": layer_means(sep).tolist(),
    }


def cls_claim(m: HeadMaps) -> tuple[Claim, dict]:
    cls = layer_means(m.maps["cls"])
    L = len(cls)
    top = int(np.argmax(cls))
    early, late = float(cls[: L // 2].mean()), float(cls[L // 2 :].mean())
    measured = (
        f"mean attention to [CLS] by layer: {', '.join(f'{v:.3f}' for v in cls)}; the largest in layer {top}; first "
        f"half of the layers {early:.3f}, second half {late:.3f}"
    )
    in_first_half, more_early = top < L // 2, early > late
    claim = Claim(
        "Attention to [CLS] is largest in the early layers",
        measured,
        verdict(in_first_half and more_early, in_first_half or more_early),
    )
    return claim, {"cls_layer_means": cls.tolist(), "cls_top_layer": top}


def positional_claim(m: HeadMaps) -> tuple[Claim, dict]:
    previous, next_ = m.maps["previous"], m.maps["next"]
    n_prev, n_next = int((previous > MOST).sum()), int((next_ > MOST).sum())
    (pl, ph), (nl, nh) = (
        np.unravel_index(previous.argmax(), previous.shape),
        np.unravel_index(next_.argmax(), next_.shape),
    )
    measured = (
        f"{n_prev} heads put over {MOST:.0%} of their attention on the previous token (most: L{pl}H{ph}, "
        f"{previous.max():.2f}), {n_next} on the next token (most: L{nl}H{nh}, {next_.max():.2f})"
    )
    claim = Claim(
        "Some heads attend to the previous token and some to the next, with most of their attention",
        measured,
        verdict(n_prev >= 1 and n_next >= 1, n_prev >= 1 or n_next >= 1),
    )
    return claim, {"previous_heads_over_half": n_prev, "next_heads_over_half": n_next}


def broad_claim(m: HeadMaps) -> tuple[Claim, dict]:
    entropy = layer_means(m.maps["entropy"])
    L, top = len(entropy), int(np.argmax(entropy))
    early, late = float(entropy[: L // 2].mean()), float(entropy[L // 2 :].mean())
    measured = (
        f"mean attention entropy by layer (nats): {', '.join(f'{v:.2f}' for v in entropy)} (uniform over the "
        f"{m.T} tokens: {math.log(m.T):.2f}); the broadest is layer {top}"
    )
    claim = Claim("Heads in the early layers attend broadly", measured, verdict(top == 0, early > late))
    return claim, {"entropy_layer_means": entropy.tolist(), "entropy_top_layer": top}


def no_op_claim(m: HeadMaps) -> tuple[Claim, dict]:
    """Clark et al. argue it for [SEP]; a model whose heads park their attention on [CLS] instead (MiniLM's do) is
    read on both special tokens together."""
    special = m.maps["sep"] + m.maps["cls"]
    parked, cost = special > MOST, m.maps["cost"]
    n_parked, n_sep = int(parked.sum()), int((m.maps["sep"] > MOST).sum())
    if n_parked in (0, parked.size):
        measured = (
            f"{n_parked} of {parked.size} heads put most of their attention on [CLS] and [SEP]: no groups to compare"
        )
        return Claim(NO_OP, measured, verdict(False)), {"parked_heads": n_parked}
    on_special, others = float(np.median(cost[parked])), float(np.median(cost[~parked]))
    measured = (
        f"median cost of zeroing a head (1 - cosine of the mean-pooled sentence embedding): {on_special:.2e} for the "
        f"{n_parked} heads with over {MOST:.0%} of their attention on [CLS] and [SEP] ({n_sep} of them on [SEP] "
        f"alone), {others:.2e} for the other {int((~parked).sum())}"
    )
    lower = on_special < others
    numbers = {"parked_heads": n_parked, "cost_median_parked": on_special, "cost_median_others": others}
    return Claim(NO_OP, measured, verdict(lower and n_parked >= MIN_GROUP, lower)), numbers


NO_OP = (
    "Attention to the special tokens acts as a no-op (argued for [SEP]): heads that mostly attend to [CLS] and [SEP] "
    "matter less when zeroed"
)


def claims(m: HeadMaps) -> tuple[list[Claim], dict]:
    found, numbers = [], {"T": m.T}
    for claim, claim_numbers in (sep_claim(m), cls_claim(m), positional_claim(m), broad_claim(m), no_op_claim(m)):
        found.append(claim)
        numbers.update(claim_numbers)
    return found, numbers


def check(run_dir: Path, out: Path) -> Finding:
    from headcount.pretrained.run_config import checkpoint_tokenizer

    run = load_run(run_dir)
    a = run.config.ablation
    tokenizer = checkpoint_tokenizer(run.config.model.pretrained).tokenizer
    examples = run.examples(a.split, a.n_eval, "ablation.split")
    inputs_NT, types_NT = bert_pairs(examples["input_ids"], tokenizer.cls_token_id, tokenizer.sep_token_id)
    maps = head_maps(run.model, inputs_NT, types_NT, a.batch_size)
    found, numbers = claims(maps)
    numbers |= {"n_examples": len(inputs_NT), "maps": {name: values.tolist() for name, values in maps.maps.items()}}
    subject = describe_run(run.config, run_dir)
    figures = [
        head_heatmap(
            per_head_table(maps.maps[name], name), out / f"clark_{name}.png", name, f"{label}\n{subject}", label
        )
        for name, label in MEASURES.items()
    ]
    return Finding("clark_attention", PAPER, found, numbers, figures)


def per_head_table(values_LH: np.ndarray, column: str) -> pd.DataFrame:
    L, H = values_LH.shape
    return pd.DataFrame(
        {"layer": np.repeat(np.arange(L), H), "head": np.tile(np.arange(H), L), column: values_LH.reshape(-1)}
    )


FINDINGS.register(
    FindingChecker(
        "clark_attention",
        check,
        "run",
        (),
        "Clark et al. 2019: heads on [SEP] and [CLS], positional heads, broad early layers, [SEP] as a no-op",
    )
)

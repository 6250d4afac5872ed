"""Voita et al. (2019), "Analyzing Multi-Head Self-Attention", on the encoder of a translation model trained here on
the generated translation task (data/translation.py, whose generator knows every dependency arc and word frequency):
(1) positional, syntactic and rare-word heads exist, with their confidence; (2) L0 gates on the encoder heads, trained
on the translation loss under rising penalties, prune the specialised heads last; (3) most encoder heads can go at a
small BLEU cost. The roles are read off each encoder head's attention patterns over the evaluation sentences
(EncoderDecoder.encoder_patterns, ablation/methods/head_roles.py); the gates are ablation/methods/encoder_l0_gates.py,
scored by BLEU of greedy translations with the kept heads only (the others zeroed)."""

from pathlib import Path

import numpy as np
import pandas as pd
import torch
from omegaconf import OmegaConf

from headcount.ablation.methods.encoder_l0_gates import train_encoder_gates
from headcount.ablation.methods.head_roles import layer_roles, sentence_facts
from headcount.ablation.methods.translation_quality import loss_columns, translation_quality
from headcount.config.ablation import L0GatesConfig
from headcount.config.data import DataConfig
from headcount.data.translation import TranslationPairs, split_pairs
from headcount.errors import ConfigError
from headcount.findings.claims import FINDINGS, Claim, Finding, FindingChecker, verdict
from headcount.io import atomic_write_text
from headcount.model.encoder_decoder import EncoderDecoder
from headcount.run_dir import load_run

PAPER = "Voita et al. 2019, Analyzing Multi-Head Self-Attention (an NMT encoder's head roles and L0 gates)"
LITTLE = 1.0  # BLEU points: a "small cost" (as nmt_heads)
# Fixed L0 penalties per expected open head, on a loss in nats a target token: from one that keeps nearly every head
# of a trained model to one that closes nearly all (Voita's lambda runs over a similar range)
PENALTIES = (0.001, 0.003, 0.01, 0.03, 0.1)
GATES = L0GatesConfig(steps=300, lr=0.1)
SMOKE_GATE_STEPS = 3  # size=smoke checks the pipeline runs, in seconds
# A rare-word head: its argmax is the sentence's rarest token for at least half the queries (Voita's rare-word head
# points there most of the time), and at least twice as often as a uniform choice of token would
RARE_SHARE = 0.5


def check(run_dir: Path, out: Path) -> Finding:
    run = load_run(run_dir)
    data = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DataConfig), run.config.data))
    if not isinstance(run.model, EncoderDecoder) or data.source != "translation_seq2seq":
        raise ConfigError("data.source", data.source, "finding nmt_roles needs data=translation_seq2seq (an encoder)")
    a = run.config.ablation
    pairs = split_pairs(data, a.split, a.n_eval)
    train = split_pairs(data, "train", a.n_eval)
    steps = SMOKE_GATE_STEPS if run.config.get("size") == "smoke" else GATES.steps
    cfg = L0GatesConfig(**{**GATES.__dict__, "steps": steps, "seed": int(run.config.seed)})
    tables = measure(run.model, pairs, train, cfg, a.batch_size)
    for name, table in tables.items():
        if isinstance(table, pd.DataFrame):
            atomic_write_text(out / f"{name}.csv", table.to_csv(index=False))
    return claims(tables)


def encoder_roles(
    model: EncoderDecoder, pairs: TranslationPairs, batch_size: int = 256
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each encoder head's roles (head_roles.layer_roles) over the sentences, and the syntactic table."""
    facts = sentence_facts(pairs)
    device = next(model.parameters()).device
    parts = []
    for start in range(0, len(pairs.source), batch_size):
        src = torch.as_tensor(pairs.source[start : start + batch_size], device=device)
        keep = torch.as_tensor(facts.valid[start : start + batch_size], device=device)
        parts.append(model.encoder_patterns(src, keep).double().cpu())
    patterns_BLHSS = torch.cat(parts)
    roles, syntax = zip(
        *(layer_roles(patterns_BLHSS[:, layer], facts, layer) for layer in range(patterns_BLHSS.shape[1]))
    )
    return pd.concat(roles, ignore_index=True), pd.concat(syntax, ignore_index=True)


def measure(model: EncoderDecoder, pairs: TranslationPairs, train: TranslationPairs, cfg: L0GatesConfig,
            batch_size: int) -> dict:  # fmt: skip
    roles, syntax = encoder_roles(model, pairs, batch_size)
    base = translation_quality(model, pairs, None, batch_size)
    columns = {name: torch.as_tensor(a) for name, a in loss_columns(model, train).items()}
    batches = [
        {name: a[s : s + batch_size] for name, a in columns.items()} for s in range(0, len(train.source), batch_size)
    ]
    runs, survival = [], []
    for penalty in PENALTIES:
        result = train_encoder_gates(model, batches, cfg, penalty)
        keep = result.keep_LH.float()
        q = translation_quality(model, pairs, {"enc": keep}, batch_size)
        runs.append(
            {
                "penalty": penalty,
                "n_kept": int(result.keep_LH.sum()),
                "bleu": q.bleu,
                "loss": q.loss,
                "delta_bleu": q.bleu - base.bleu,
                "final_task_loss": result.task_loss[-1],
            }
        )
        for layer, head in np.ndindex(result.survival_LH.shape):
            kept, share = bool(result.keep_LH[layer, head]), float(result.survival_LH[layer, head])
            survival.append({"penalty": penalty, "layer": layer, "head": head, "kept": kept, "survival": share})
    survival = pd.DataFrame(survival)
    per_head = survival.groupby(["layer", "head"], as_index=False).survival.mean()
    roles = roles.merge(per_head, on=["layer", "head"])
    return {
        "baseline": {"bleu": base.bleu, "loss": base.loss, "sentences": len(pairs.source), "n_heads": len(roles)},
        "roles": roles,
        "syntactic": syntax,
        "gate_runs": pd.DataFrame(runs),
        "gate_survival": survival,
    }


def rare_word(roles: pd.DataFrame) -> pd.Series:
    return (roles.rare_share >= RARE_SHARE) & (roles.rare_share >= 2 * roles.rare_chance)


def claims(tables: dict) -> Finding:
    base, roles, runs = tables["baseline"], tables["roles"], tables["gate_runs"]
    n = len(roles)
    label = [f"enc.L{r.layer}H{r.head}" for r in roles.itertuples()]
    kinds = {"positional": roles.positional, "syntactic": roles.syntactic, "rare-word": rare_word(roles)}
    found = {kind: [lab for lab, on in zip(label, mask) if on] for kind, mask in kinds.items()}
    n_kinds = sum(bool(heads) for heads in found.values())

    def described(kind: str) -> str:
        rows = roles[kinds[kind].to_numpy()]
        heads = ", ".join(f"enc.L{r.layer}H{r.head} (confidence {r.confidence:.2f})" for r in rows.itertuples())
        return f"{kind}: {heads or 'none'}"

    specialised = np.zeros(n, dtype=bool)
    for mask in kinds.values():
        specialised |= mask.to_numpy()
    spec_survival = roles.survival[specialised]
    other_survival = roles.survival[~specialised]
    if len(spec_survival) and len(other_survival):
        spec_mean, other_mean = float(spec_survival.mean()), float(other_survival.mean())
        last = roles.survival == roles.survival.max()
        last_specialised = bool(specialised[last.to_numpy()].all())
        survive_text = (f"mean survival (share of gate steps a head stayed open, over {len(runs)} penalties): "
                        f"specialised {spec_mean:.2f}, others {other_mean:.2f}; the last to close: "
                        + ", ".join(lab for lab, on in zip(label, last) if on))  # fmt: skip
        survive_verdict = verdict(spec_mean > other_mean and last_specialised, partly=spec_mean > other_mean)
    else:
        spec_mean = other_mean = None
        survive_text = "not testable: " + (
            "no specialised head" if not len(spec_survival) else "every head specialised"
        )
        survive_verdict = "not reproduced"
    small = runs[runs.delta_bleu > -LITTLE]
    fewest = int(small.n_kept.min()) if len(small) else None
    pruned_share = (n - fewest) / n if fewest is not None else 0.0
    run_text = "; ".join(f"lambda {r.penalty:g}: {r.n_kept} heads, BLEU {r.bleu:.1f}" for r in runs.itertuples())
    numbers = {
        "baseline_bleu": base["bleu"],
        "baseline_loss": base["loss"],
        "sentences": base["sentences"],
        "n_heads": n,
        "heads_by_role": found,
        "confidence": dict(zip(label, roles.confidence.astype(float))),
        "survival": dict(zip(label, roles.survival.astype(float))),
        "specialised_mean_survival": spec_mean,
        "other_mean_survival": other_mean,
        "gate_runs": runs.to_dict(orient="records"),
        "fewest_heads_within_1_bleu": fewest,
        "pruned_share_within_1_bleu": pruned_share,
    }
    claim_list = [
        Claim(
            "(1) Positional, syntactic and rare-word heads exist in the encoder",
            "; ".join(described(kind) for kind in kinds),
            verdict(n_kinds == 3, partly=n_kinds > 0),
        ),
        Claim("(2) The specialised heads are the last to be pruned by L0 gates", survive_text, survive_verdict),
        Claim(
            f"(3) Most encoder heads can go at a small BLEU cost (under {LITTLE:g})",
            f"fewest heads kept within {LITTLE:g} BLEU of {base['bleu']:.1f}: "
            + (f"{fewest} of {n} ({pruned_share:.0%} pruned)" if fewest is not None else "none")
            + f". {run_text}",
            verdict(pruned_share > 0.5, partly=pruned_share > 0),
        ),
    ]
    return Finding("nmt_roles", PAPER, claim_list, numbers)


FINDINGS.register(
    FindingChecker(
        "nmt_roles",
        check,
        "run",
        (),
        "Voita et al. 2019 on a translation model's encoder: head roles and L0 gates",
    )
)

"""Michel et al. (2019), "Are Sixteen Heads Really Better than One?", in its own setting: a translation model
trained here on the generated translation task (data/translation.py), scored by BLEU of its greedy translations and
its loss: (a) most heads can be removed alone at little cost; (b) pruning in gradient-importance order removes a good
share of heads before BLEU drops, more than a random order; (c) encoder-decoder attention is the most sensitive to
pruning; (d) in many layers one head is enough. Measured by findings/translation_heads.py, the tables written beside
findings.md."""

from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from headcount.config.data import DataConfig
from headcount.data.translation import split_pairs
from headcount.errors import ConfigError
from headcount.findings import figures
from headcount.findings.claims import FINDINGS, Claim, Finding, FindingChecker, verdict
from headcount.findings.run_data import run_subject
from headcount.findings.translation_heads import (
    TranslationModel,
    importance,
    one_head_per_layer,
    prunable_fraction,
    pruning_curves,
    single_heads,
)
from headcount.io import atomic_write_text
from headcount.run_dir import load_run

PAPER = "Michel et al. 2019, Are Sixteen Heads Really Better than One? (translation)"
LITTLE = 1.0  # BLEU points: "little cost" (Michel's single-head drops were mostly under 1 BLEU on WMT)
PRUNABLE_CLAIM = 0.2  # the low end of the paper's 20-40% of heads prunable


def check(run_dir: Path, out: Path) -> Finding:
    run = load_run(run_dir)
    data = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DataConfig), run.config.data))
    if data.source not in ("translation", "translation_seq2seq"):
        allowed = "finding nmt_heads needs data=translation_seq2seq (an encoder-decoder) or data=translation"
        raise ConfigError("data.source", data.source, allowed)
    a = run.config.ablation
    pairs = split_pairs(data, a.split, a.n_eval)
    model = TranslationModel.of(run.model, a.batch_size)
    tables = measure(model, pairs, int(run.config.seed))
    for name, table in tables.items():
        if isinstance(table, pd.DataFrame):
            atomic_write_text(out / f"{name}.csv", table.to_csv(index=False))
    finding = claims(tables)
    figure = figures.translation_pruning(tables["pruning"], tables["baseline"]["bleu"], out / "nmt_heads.png",
                                         run_subject(run_dir))  # fmt: skip
    finding.figures.append(figure)
    return finding


def measure(model: TranslationModel, pairs, seed: int) -> dict:
    base = model.quality(pairs)
    scores = importance(model, pairs)
    return {
        "baseline": {"bleu": base.bleu, "loss": base.loss, "exact": base.exact, "sentences": len(pairs.source)},
        "single_head": single_heads(model, pairs, base),
        "importance": scores,
        "pruning": pruning_curves(model, pairs, scores, seed),
        "one_head": one_head_per_layer(model, pairs, base),
    }


def claims(tables: dict) -> Finding:
    base, single, curves, one = tables["baseline"], tables["single_head"], tables["pruning"], tables["one_head"]
    kinds = list(dict.fromkeys(single.kind))
    share_little = float((single.delta_bleu > -LITTLE).mean())
    prunable = {
        order: prunable_fraction(curve, base["bleu"], LITTLE) for order, curve in curves.groupby("order", sort=False)
    }
    overall = prunable["all" if "all" in prunable else kinds[0]]
    best_one = one.groupby(["kind", "layer"]).delta_bleu.max()
    layers_fine = int((best_one > -LITTLE).sum())
    numbers = {
        "baseline_bleu": base["bleu"],
        "baseline_loss": base["loss"],
        "baseline_exact": base["exact"],
        "sentences": base["sentences"],
        "kinds": kinds,
        "n_heads": len(single),
        "share_of_heads_under_1_bleu": share_little,
        "largest_single_head_drop_bleu": float(-single.delta_bleu.min()),
        "prunable_fraction": prunable,
        "one_head_best_delta_bleu": {f"{k}.L{layer}": float(v) for (k, layer), v in best_one.items()},
        "layers_fine_with_one_head": layers_fine,
    }
    by_kind = {kind: prunable[kind] for kind in kinds}
    sensitive_text = ", ".join(f"{kind} {fraction:.0%}" for kind, fraction in by_kind.items())
    if "cross" in by_kind:
        others = [f for kind, f in by_kind.items() if kind != "cross"]
        c = Claim(
            "(c) Encoder-decoder attention is the most sensitive to pruning",
            f"prunable within {LITTLE:g} BLEU, each kind pruned alone: {sensitive_text}",
            verdict(by_kind["cross"] < min(others), partly=by_kind["cross"] == min(others)),  # tied: partly
        )
    else:
        c = Claim(
            "(c) Encoder-decoder attention is the most sensitive to pruning",
            f"not testable: this model has no encoder-decoder attention (kinds: {', '.join(kinds)}; {sensitive_text})",
            "not reproduced",
        )
    claims = [
        Claim(
            f"(a) Most heads can be removed alone at little cost (BLEU down by under {LITTLE:g})",
            f"{share_little:.0%} of {len(single)} heads (baseline BLEU {base['bleu']:.1f}; largest drop "
            f"{-single.delta_bleu.min():.1f})",
            verdict(share_little > 0.5, partly=share_little > 0.25),
        ),
        Claim(
            f"(b) Gradient-importance order prunes 20-40% of heads within {LITTLE:g} BLEU, more than random",
            f"importance order {overall:.0%}, random order {prunable['random']:.0%}",
            verdict(overall >= PRUNABLE_CLAIM and overall > prunable["random"], partly=overall > prunable["random"]),
        ),
        c,
        Claim(
            f"(d) Many layers keep their BLEU (within {LITTLE:g}) with one head",
            f"{layers_fine} of {len(best_one)} layers; per layer: "
            + ", ".join(f"{k}.L{layer} {v:+.1f}" for (k, layer), v in best_one.items()),
            verdict(layers_fine > len(best_one) / 2, partly=layers_fine > 0),
        ),
    ]
    return Finding("nmt_heads", PAPER, claims, numbers)


FINDINGS.register(
    FindingChecker(
        "nmt_heads",
        check,
        "run",
        (),
        "Michel et al. 2019 on a translation model: most heads can go, by BLEU",
    )
)

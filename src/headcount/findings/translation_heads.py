"""Michel et al. 2019's measurements on a translation model, scored by BLEU of greedy translations and the
teacher-forced loss (ablation/methods/translation_quality.py), by kind of head. A one-stack model reading BOS source
SEP target (a decoder-only translator) has one kind, `dec`; an encoder-decoder has `enc`, `dec` and `cross`.

- single: each head zeroed alone;
- importance: Michel's gradient importance of each head's gate on the loss, E_x |dL_x/dg_h| (per example, at all
  gates 1), normalised per layer of a kind (l2) as Michel prunes by it;
- pruning: each kind's heads zeroed in increasing importance order, one more at a time, the other kinds intact;
  every head of every kind in one order (the normalised scores); and a random order (seeded) over every head;
- one head: for each layer of each kind, every head kept alone in that layer (its other heads zeroed)."""

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from headcount.ablation.methods.translation_quality import (
    Model,
    TranslationQuality,
    loss_columns,
    teacher_forced_logits,
    translation_quality,
)
from headcount.data.translation import TranslationPairs
from headcount.model.encoder_decoder import EncoderDecoder

Kinds = dict[str, tuple[int, int]]  # kind -> (layers, heads)
Gates = dict[str, torch.Tensor]  # kind -> (layers, heads) in [0, 1]


@dataclass
class TranslationModel:
    """A translation model with its heads by kind: scores a set of gates by kind on sentence pairs."""

    model: Model
    kinds: Kinds
    batch_size: int = 256

    @classmethod
    def of(cls, model: Model, batch_size: int = 256) -> "TranslationModel":
        if isinstance(model, EncoderDecoder):
            return cls(model, dict(model.head_kinds), batch_size)
        return cls(model, {"dec": (model.n_layers, model.max_heads)}, batch_size)

    def ones(self) -> Gates:
        return {kind: torch.ones(shape, dtype=torch.float32) for kind, shape in self.kinds.items()}

    def model_gates(self, gates: Gates) -> torch.Tensor | Gates:
        return gates if isinstance(self.model, EncoderDecoder) else gates["dec"]

    def quality(self, pairs: TranslationPairs, gates: Gates | None = None) -> TranslationQuality:
        model_gates = None if gates is None else self.model_gates(gates)
        return translation_quality(self.model, pairs, model_gates, self.batch_size)

    def gate_gradients(self, pairs: TranslationPairs) -> dict[str, np.ndarray]:
        """kind -> (examples, layers, heads): dL_x/dg for each example's own mean target loss, at all gates 1."""
        columns = {name: torch.as_tensor(a) for name, a in loss_columns(self.model, pairs).items()}
        out: dict[str, list[np.ndarray]] = {kind: [] for kind in self.kinds}
        for start in range(0, len(columns["input_ids"]), self.batch_size):
            batch = {name: a[start : start + self.batch_size] for name, a in columns.items()}
            n = len(batch["input_ids"])
            gates = {kind: torch.ones((n, *shape), requires_grad=True) for kind, shape in self.kinds.items()}
            logits = teacher_forced_logits(self.model, batch, self.model_gates(gates))[:, :-1].float()
            losses = F.cross_entropy(logits.transpose(1, 2), batch["input_ids"][:, 1:], reduction="none")
            marks = batch["loss_mask"][:, 1:].float()
            per_example = (losses * marks).sum(1) / marks.sum(1)
            grads = torch.autograd.grad(per_example.sum(), list(gates.values()))
            for kind, grad in zip(gates, grads):
                out[kind].append(grad.double().numpy())
        return {kind: np.concatenate(parts) for kind, parts in out.items()}


def head_rows(kinds: Kinds) -> list[tuple[str, int, int]]:
    return [
        (kind, layer, head)
        for kind, (layers, heads) in kinds.items()
        for layer in range(layers)
        for head in range(heads)
    ]


def with_off(model: TranslationModel, heads: list[tuple[str, int, int]], keep: Gates | None = None) -> Gates:
    gates = {kind: g.clone() for kind, g in (keep or model.ones()).items()}
    for kind, layer, head in heads:
        gates[kind][layer, head] = 0.0
    return gates


def single_heads(model: TranslationModel, pairs: TranslationPairs, base: TranslationQuality) -> pd.DataFrame:
    rows = []
    for kind, layer, head in head_rows(model.kinds):
        q = model.quality(pairs, with_off(model, [(kind, layer, head)]))
        rows.append(row(kind, layer, head, q, base))
    return pd.DataFrame(rows)


def row(kind: str, layer: int, head: int, q: TranslationQuality, base: TranslationQuality) -> dict:
    return {
        "kind": kind,
        "layer": layer,
        "head": head,
        "bleu": q.bleu,
        "loss": q.loss,
        "delta_bleu": q.bleu - base.bleu,
        "delta_loss": q.loss - base.loss,
    }


def importance(model: TranslationModel, pairs: TranslationPairs) -> pd.DataFrame:
    """kind, layer, head, importance (E_x |dL_x/dg|) and normalised (divided by the l2 norm of its layer's)."""
    rows = []
    for kind, grads in model.gate_gradients(pairs).items():
        scores = np.abs(grads).mean(axis=0)  # (layers, heads)
        norms = np.linalg.norm(scores, axis=1, keepdims=True)
        normalised = np.where(norms > 0, scores / np.where(norms > 0, norms, 1), 0.0)
        for layer, head in np.ndindex(scores.shape):
            rows.append((kind, layer, head, float(scores[layer, head]), float(normalised[layer, head])))
    return pd.DataFrame(rows, columns=["kind", "layer", "head", "importance", "normalised"])


def pruning_curve(
    model: TranslationModel, pairs: TranslationPairs, order: list[tuple[str, int, int]], name: str
) -> pd.DataFrame:
    """BLEU and loss with the first n heads of `order` zeroed, n = 0..len(order)."""
    rows = []
    for n in range(len(order) + 1):
        q = model.quality(pairs, with_off(model, order[:n]))
        rows.append({"order": name, "n_pruned": n, "fraction": n / len(order), "bleu": q.bleu, "loss": q.loss})
    return pd.DataFrame(rows)


def pruning_curves(model: TranslationModel, pairs: TranslationPairs, scores: pd.DataFrame, seed: int) -> pd.DataFrame:
    """Per kind (`<kind>`), every head (`all`) and every head at random (`random`)."""
    by_score = scores.sort_values(["normalised", "importance", "kind", "layer", "head"], kind="stable")
    heads = [(r.kind, int(r.layer), int(r.head)) for r in by_score.itertuples()]
    curves = [pruning_curve(model, pairs, [h for h in heads if h[0] == kind], kind) for kind in model.kinds]
    if len(model.kinds) > 1:
        curves.append(pruning_curve(model, pairs, heads, "all"))
    shuffled = [heads[i] for i in np.random.default_rng(seed).permutation(len(heads))]
    curves.append(pruning_curve(model, pairs, shuffled, "random"))
    return pd.concat(curves, ignore_index=True)


def one_head_per_layer(model: TranslationModel, pairs: TranslationPairs, base: TranslationQuality) -> pd.DataFrame:
    """For each kind and layer, each head kept alone in its layer: kind, layer, head, bleu, loss, deltas."""
    rows = []
    for kind, (layers, heads) in model.kinds.items():
        for layer in range(layers):
            for keep in range(heads):
                off = [(kind, layer, h) for h in range(heads) if h != keep]
                rows.append(row(kind, layer, keep, model.quality(pairs, with_off(model, off)), base))
    return pd.DataFrame(rows)


def prunable_fraction(curve: pd.DataFrame, base_bleu: float, tolerance: float) -> float:
    """The largest fraction pruned with BLEU at least base - tolerance at it and at every smaller fraction."""
    curve = curve.sort_values("n_pruned")
    within = (curve.bleu >= base_bleu - tolerance).to_numpy()
    first_out = int(np.argmin(within)) if not within.all() else len(within)
    return float(curve.fraction.iloc[first_out - 1])

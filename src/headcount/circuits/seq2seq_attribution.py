"""Edge scores of an encoder-decoder, teacher forced: exact, EAP and EAP-IG over seq2seq_graph.py's edges.

M(a) is the metric summed over the score points (decoder positions, (B, T) bool; default every position) of the
edge-patched forward at edge weights a (seq2seq_forward.py; a_e = 1 removes edge e). The corrupted run is the model
on a corrupted (source, target) pair, or given outputs (`Seq2SeqOutputs.zeros()`: zero ablation of every sender).
Every score is an effect M(removed) - M(clean), the definitions of attribution.py:

- exact: M(e_e) - M(0), each edge removed alone, in passes of rows_per_pass weight rows;
- EAP: dM/da_e at a = 0, by autograd through the edge forward (autograd_edges.py's way: the cross heads' keys and
  values read the encoder through its final norm, so no one-backward product of deltas and receiver gradients holds
  there);
- EAP-IG: the mean over k = 1..m of dM/da at a = 0 of the runs whose two input embeddings (the source's and the
  target's) are emb' + (k/m)(emb - emb'), the reference of the mix the clean run.
"""

import torch
from torch import Tensor

from headcount.circuits.metric import Metric, metric_at, point_values
from headcount.circuits.seq2seq_forward import Seq2SeqOutputs, seq2seq_outputs, seq2seq_stream
from headcount.circuits.seq2seq_graph import Seq2SeqGraph
from headcount.errors import ConfigError
from headcount.model.encoder_decoder import EncoderDecoder

Corrupted = tuple[Tensor, Tensor] | Seq2SeqOutputs


def corrupted_outputs(model: EncoderDecoder, corrupted: Corrupted) -> Seq2SeqOutputs:
    """The corrupted run's sender outputs: from its (source ids, target ids), or as given."""
    if isinstance(corrupted, Seq2SeqOutputs):
        return corrupted
    src_BS, tgt_BT = corrupted
    return seq2seq_outputs(model, src_BS, tgt_BT)


def score_points(tgt_BT: Tensor, points_BT: Tensor | None) -> Tensor:
    if points_BT is None:
        return torch.ones(tgt_BT.shape, dtype=torch.bool, device=tgt_BT.device)
    if points_BT.dtype != torch.bool or points_BT.shape != tgt_BT.shape:
        raise ValueError(f"score points must be a bool mask of the target's shape {tuple(tgt_BT.shape)}")
    return points_BT


def seq2seq_edge_metric(
    model: EncoderDecoder,
    src_BS: Tensor,
    tgt_BT: Tensor,
    corrupted: Corrupted,
    weights_NE: Tensor,
    metric: Metric,
    points_BT: Tensor | None = None,
    rows_per_pass: int = 16,
    held_NR: Tensor | None = None,
    examples_per_pass: int | None = None,
) -> Tensor:
    """(N,) float64: M at each row of edge weights, summed over the points in point order, in passes of
    rows_per_pass rows of examples_per_pass examples (None: all). held_NR: (N, receivers) bool, receivers held at the
    clean run's outputs (seq2seq_forward.seq2seq_stream; path patching)."""
    points_BT = score_points(tgt_BT, points_BT)
    outputs = corrupted_outputs(model, corrupted)
    clean = None if held_NR is None else seq2seq_outputs(model, src_BS, tgt_BT)
    values_NP = torch.empty(len(weights_NE), int(points_BT.sum()), dtype=torch.float64)
    with torch.no_grad():
        for examples, columns in example_passes(points_BT, examples_per_pass):
            enc_emb, dec_emb = model.encoder.embed(src_BS[examples]), model.decoder.embed(tgt_BT[examples])
            corrupt, held_clean = outputs.examples(examples), None if clean is None else clean.examples(examples)
            for start in range(0, len(weights_NE), rows_per_pass):
                rows = slice(start, start + rows_per_pass)
                held = None if held_NR is None else held_NR[rows]
                stream, _ = seq2seq_stream(model, enc_emb, dec_emb, weights_NE[rows], corrupt, None, held, held_clean)
                n = len(weights_NE[rows])
                values_NP[rows, columns] = metric_values(
                    model, stream, points_BT[examples], metric_at(metric, columns), n
                )
    return values_NP.sum(1)


def example_passes(points_BT: Tensor, examples_per_pass: int | None) -> list[tuple[slice, slice]]:
    """(examples, their points' columns in point order) per pass of examples_per_pass examples (None: one pass)."""
    B = points_BT.shape[0]
    step = B if examples_per_pass is None else examples_per_pass
    if step < 1:
        raise ConfigError("examples_per_pass", examples_per_pass, "must be at least 1 (or None: every example)")
    ends = [0, *points_BT.sum(1).cumsum(0).tolist()]
    return [(slice(b, min(b + step, B)), slice(ends[b], ends[min(b + step, B)])) for b in range(0, B, step)]


def metric_values(model: EncoderDecoder, stream: Tensor, points_BT: Tensor, metric: Metric, n: int) -> Tensor:
    """(N, P) float64: the metric at each point of each of N runs, the stream unembedded at the points only."""
    logits_NPV = model.decoder.unembed(stream.view(n, *points_BT.shape, -1)[:, points_BT])
    return point_values(logits_NPV, metric)


def seq2seq_exact_edge_scores(
    model: EncoderDecoder,
    src_BS: Tensor,
    tgt_BT: Tensor,
    corrupted: Corrupted,
    metric: Metric,
    points_BT: Tensor | None = None,
    edges: list[int] | None = None,
    rows_per_pass: int = 16,
    examples_per_pass: int | None = None,
) -> Tensor:
    """(E,) float64 in Seq2SeqGraph.of(model).edges' order (or the `edges` given, in their order): M(edge removed
    alone) - M(clean)."""
    graph = Seq2SeqGraph.of(model)
    chosen = list(range(len(graph.edges))) if edges is None else list(edges)
    weights_NE = src_BS.new_zeros(len(chosen) + 1, len(graph.edges), dtype=model.decoder.tok_emb.weight.dtype)
    weights_NE[torch.arange(1, len(chosen) + 1), torch.tensor(chosen, dtype=torch.long)] = 1
    args = (weights_NE, metric, points_BT, rows_per_pass, None, examples_per_pass)
    values = seq2seq_edge_metric(model, src_BS, tgt_BT, corrupted, *args)
    return values[1:] - values[0]


def seq2seq_eap_scores(
    model: EncoderDecoder,
    src_BS: Tensor,
    tgt_BT: Tensor,
    corrupted: Corrupted,
    metric: Metric,
    points_BT: Tensor | None = None,
    examples_per_pass: int | None = None,
) -> Tensor:
    """(E,) float64: EAP, dM/da at a = 0 on the clean run."""
    return seq2seq_eap_ig_scores(model, src_BS, tgt_BT, corrupted, metric, points_BT, None, examples_per_pass)


def seq2seq_eap_ig_scores(
    model: EncoderDecoder,
    src_BS: Tensor,
    tgt_BT: Tensor,
    corrupted: Corrupted,
    metric: Metric,
    points_BT: Tensor | None = None,
    steps: int | None = 5,
    examples_per_pass: int | None = None,
) -> Tensor:
    """(E,) float64: EAP-IG with `steps` interpolations of both embeddings (steps None: EAP), each the edge forward's
    own gradient, one forward and backward of steps * B rows per pass of examples_per_pass examples (None: all), the
    passes' gradients added in float64."""
    if steps is not None and steps < 1:
        raise ConfigError("steps", steps, "EAP-IG needs at least 1 interpolation step")
    graph = Seq2SeqGraph.of(model)
    points_BT = score_points(tgt_BT, points_BT)
    outputs = corrupted_outputs(model, corrupted)
    enc_emb, dec_emb = model.encoder.embed(src_BS).detach(), model.decoder.embed(tgt_BT).detach()
    reference = None
    if steps is not None:
        reference = seq2seq_outputs(model, src_BS, tgt_BT)
        alpha_N = torch.arange(1, steps + 1, dtype=enc_emb.dtype, device=enc_emb.device) / steps
        enc_emb = outputs.enc.emb + alpha_N[:, None, None, None] * (enc_emb - outputs.enc.emb)
        dec_emb = outputs.dec.emb + alpha_N[:, None, None, None] * (dec_emb - outputs.dec.emb)
    runs = 1 if steps is None else steps
    total_E = torch.zeros(len(graph.edges), dtype=torch.float64)
    for examples, columns in example_passes(points_BT, examples_per_pass):
        at = examples if steps is None else (slice(None), examples)
        weights_NE = enc_emb.new_zeros(runs, len(graph.edges)).requires_grad_()
        ref = None if reference is None else reference.examples(examples)
        with torch.enable_grad():
            stream, _ = seq2seq_stream(model, enc_emb[at], dec_emb[at], weights_NE, outputs.examples(examples), ref)
            values_NP = metric_values(model, stream, points_BT[examples], metric_at(metric, columns), runs)
            (grad_NE,) = torch.autograd.grad(values_NP.sum(), weights_NE)
        total_E += grad_NE.double().sum(0).cpu()
    return total_E / runs


def seq2seq_faithfulness(
    model: EncoderDecoder,
    src_BS: Tensor,
    tgt_BT: Tensor,
    corrupted: Corrupted,
    circuits: list[list[int]],
    metric: Metric,
    points_BT: Tensor | None = None,
    rows_per_pass: int = 16,
    examples_per_pass: int | None = None,
) -> Tensor:
    """(len(circuits),) float64: each circuit's faithfulness (M(every edge outside it removed) - M(all removed)) /
    (M(clean) - M(all removed)), a circuit being the edge indices it keeps (not pruned: an edge whose sender no kept
    path reaches carries that sender's output computed from corrupted inputs, its corrupted output, so pruning would
    not change the number)."""
    graph = Seq2SeqGraph.of(model)
    weights_NE = torch.ones(len(circuits) + 2, len(graph.edges), dtype=model.decoder.tok_emb.weight.dtype)
    weights_NE[0] = 0  # the clean model; row 1: every edge removed
    for row, kept in enumerate(circuits, start=2):
        weights_NE[row, torch.tensor(list(kept), dtype=torch.long)] = 0
    args = (weights_NE, metric, points_BT, rows_per_pass, None, examples_per_pass)
    values = seq2seq_edge_metric(model, src_BS, tgt_BT, corrupted, *args)
    return (values[2:] - values[1]) / (values[0] - values[1])

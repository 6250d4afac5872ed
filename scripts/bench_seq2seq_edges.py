"""Edges through cross-attention on a trained translator: exact scores of every edge, EAP and EAP-IG, their time and
how well the estimates rank the edges as the exact scores do, path patching of each encoder sender into the cross
heads' keys and values (docs/BENCHMARKS.md, "Edges through cross-attention").

The run is a finished encoder-decoder run on data=translation_seq2seq (for example `headcount-train model=nmt_encdec
data=translation_seq2seq size=smoke 'ablation=[]' hydra.run.dir=outputs/nmt_smoke`). Its validation sentences of the
most common source length are the clean sources (an encoder's edges take one length); the corrupted run is each
sentence's target with the next sentence's source; the metric is log p of each target token, teacher forced, at every
target position. Scores are in float64.

    python scripts/bench_seq2seq_edges.py outputs/nmt_smoke --sentences 16 --steps 5
"""

import argparse
import time
from collections import Counter

import torch

from headcount.api import load_run
from headcount.circuits import (
    PointMetric,
    Seq2SeqGraph,
    ranking_agreement,
    seq2seq_eap_ig_scores,
    seq2seq_eap_scores,
    seq2seq_exact_edge_scores,
    seq2seq_faithfulness,
    seq2seq_path_patch,
)
from headcount.data.translation import as_seq2seq, split_pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--sentences", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(2)
    run = load_run(args.run_dir, device="cpu")
    model = run.model.double().eval()
    pairs = split_pairs(run.config.data, "val", 512)
    length = Counter(pairs.source_lengths.tolist()).most_common(1)[0][0]
    columns = as_seq2seq(pairs, run.config.data.seq_len)
    chosen = torch.from_numpy(pairs.source_lengths == length).nonzero()[:, 0][: args.sentences]
    src = torch.from_numpy(columns["src_ids"])[chosen, :length]
    tgt = torch.from_numpy(columns["input_ids"])[chosen, : length + 2]  # BOS, the target, EOS
    loss_mask = torch.from_numpy(columns["loss_mask"])[chosen, : length + 2]
    points = torch.zeros_like(loss_mask)
    points[:, :-1] = loss_mask[:, 1:]  # position t predicts token t + 1
    answers = tgt[:, 1:][points[:, :-1]]
    metric = PointMetric(lambda logits, y: logits.log_softmax(-1).gather(1, y[:, None])[:, 0], answers)
    corrupted = (src.roll(1, 0), tgt)
    graph = Seq2SeqGraph.of(model)
    print(
        f"{len(chosen)} sentences, source length {length}, {int(points.sum())} target points, {len(graph.edges)} edges"
    )
    timed = {}
    for name, fn in [
        ("exact", lambda: seq2seq_exact_edge_scores(model, src, tgt, corrupted, metric, points, rows_per_pass=32)),
        ("eap", lambda: seq2seq_eap_scores(model, src, tgt, corrupted, metric, points)),
        ("eap_ig", lambda: seq2seq_eap_ig_scores(model, src, tgt, corrupted, metric, points, steps=args.steps)),
    ]:
        start = time.perf_counter()
        timed[name] = fn() / int(points.sum())  # per point
        print(f"{name}: {time.perf_counter() - start:.2f} s")
    exact = timed["exact"]
    for name in ("eap", "eap_ig"):
        agreement = ranking_agreement(timed[name], exact, 20)
        print(f"{name} vs exact: spearman {agreement['spearman']:.3f}, top-20 recall {agreement['top_k_recall']:.2f}")
    kinds = {"enc -> cross.k/v": 0.0, "into the encoder": 0.0, "decoder stream": 0.0}
    for edge, score in zip(graph.edges, exact.abs().tolist()):
        if edge.receiver.node.stack == "enc":
            kinds["into the encoder"] += score
        elif edge.receiver.input in ("k", "v") and edge.receiver.node.stack == "cross":
            kinds["enc -> cross.k/v"] += score
        else:
            kinds["decoder stream"] += score
    total = sum(kinds.values())
    print("share of sum |exact| by receiver:", ", ".join(f"{k} {v / total:.3f}" for k, v in kinds.items()))
    order = exact.abs().argsort(descending=True)
    for i in order[:8].tolist():
        eap, eap_ig = timed["eap"][i], timed["eap_ig"][i]
        print(f"  {graph.edges[i].name:32s} exact {exact[i]:+.4f}  eap {eap:+.4f}  eap_ig {eap_ig:+.4f}")
    # each encoder sender patched into every cross head's keys and values: what reaches the decoder through them
    memory = [r.name for r in graph.receivers if r.node.stack == "cross" and r.input in ("k", "v")]
    encoder = [node.name for node in graph.senders[: graph.n_enc_senders]]
    start = time.perf_counter()
    effects = seq2seq_path_patch(model, src, tgt, corrupted, [([s], memory) for s in encoder], metric, points)
    effects = effects / int(points.sum())
    print(f"path patching of {len(encoder)} encoder senders into the cross keys and values: ", end="")
    print(f"{time.perf_counter() - start:.2f} s")
    for i in effects.abs().argsort(descending=True)[:3].tolist():
        print(f"  {encoder[i]:12s} -> cross .k/.v {effects[i]:+.4f}")
    sizes = [10, 50, 200, len(graph.edges)]
    faith = seq2seq_faithfulness(model, src, tgt, corrupted, [order[:n].tolist() for n in sizes], metric, points)
    print(
        "faithfulness of the top-n exact circuit:", ", ".join(f"n={n} {f:.3f}" for n, f in zip(sizes, faith.tolist()))
    )


if __name__ == "__main__":
    main()

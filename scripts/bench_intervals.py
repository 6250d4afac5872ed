"""What a head scan's bootstrap intervals cost: a single_head zero-ablation scan on the same random model and data
timed on two trees, the branch's evaluator (each example's sums kept, ablation/engine/evaluator.py) and another
checkout's (`--baseline-src`: e.g. /work/main/src, the evaluator before it kept them), each in its own process, then
the branch's intervals from those sums (1000 resamples, ablation/scans/intervals.py). CPU seconds of this process
(time.process_time: both cores count when torch uses two), the fastest of --repeats runs each; the scans' tables must
agree (the sums are the same bits).

    python scripts/bench_intervals.py --baseline-src /work/main/src [--repeats 3] [--n-seq 256]
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
LAYERS, HEADS, WIDTH, VOCAB, SEQ_LEN = 4, 8, 128, 256, 64


def measure(n_seq: int, repeats: int, intervals: bool) -> dict:
    """In this process: the scan's CPU seconds (and the intervals', on the branch)."""
    import torch

    from headcount.ablation.engine.evaluator import MaskEvaluator, MaskTotals
    from headcount.ablation.engine.masks import HeadMask, masks_to_gates, single_head_masks

    torch.manual_seed(0)
    from headcount.model import AttentionConfig, ModelConfig, Transformer

    cfg = ModelConfig(
        n_layers=LAYERS, d_model=WIDTH, n_ctx=SEQ_LEN, vocab_size=VOCAB, attn=AttentionConfig(n_heads=HEADS), mlp=True
    )
    model = Transformer(cfg).eval()
    ids = torch.randint(0, VOCAB, (n_seq, SEQ_LEN), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[:, 0] = False
    batches = [{"input_ids": ids[i : i + 32], "loss_mask": mask[i : i + 32]} for i in range(0, n_seq, 32)]
    evaluator = MaskEvaluator(model, batches)
    masks = [*single_head_masks(model.heads_per_layer), HeadMask("none", ())]
    gates = masks_to_gates(masks, model.heads_per_layer)
    scan, sums = [], None
    for _ in range(repeats):
        kept = {"n_examples": evaluator.n_examples} if intervals else {}
        totals = MaskTotals.empty(len(masks), evaluator.columns, **kept)
        start = time.process_time()
        evaluator.accumulate(gates, totals)
        scan.append(time.process_time() - start)
        sums = totals.sums[:, 0].tolist()
    result = {"scan_cpu_s": min(scan), "sums": sums, "masks": len(masks) - 1, "examples": n_seq}
    if intervals:
        import pandas as pd

        from headcount.ablation.engine.metrics import metric_named
        from headcount.ablation.scans.intervals import example_points, with_intervals

        head = MaskTotals(totals.batches_done[:-1], totals.sums[:-1], totals.n_targets[:-1], totals.columns)
        head.examples = totals.examples[:-1]
        table = pd.DataFrame({"mask": [m.name for m in masks[:-1]]})
        timed = []
        for _ in range(repeats):
            start = time.process_time()
            with_intervals(table, head, totals.examples[-1], example_points(evaluator), metric_named("loss"), 0)
            timed.append(time.process_time() - start)
        result["intervals_cpu_s"] = min(timed)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-src", type=Path, help="another tree's src/ (the evaluator without the sums)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--n-seq", type=int, default=256)
    parser.add_argument("--child", choices=["branch", "baseline"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.n_seq, args.repeats, args.child == "branch")))
        return
    runs = {}
    for name, src in (("branch", SRC), ("baseline", args.baseline_src)):
        if src is None:
            continue
        command = [
            sys.executable,
            __file__,
            "--child",
            name,
            "--repeats",
            str(args.repeats),
            "--n-seq",
            str(args.n_seq),
        ]
        out = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(src)})
        if out.returncode:
            sys.exit(out.stderr[-2000:])
        runs[name] = json.loads(out.stdout.splitlines()[-1])
    branch = runs["branch"]
    print(f"single_head scan: {branch['masks']} masks x {branch['examples']} sequences of {SEQ_LEN} tokens")
    print(f"  branch (each example's sums kept): {branch['scan_cpu_s']:.2f} CPU s")
    if "baseline" in runs:
        base = runs["baseline"]
        assert base["sums"] == branch["sums"], "the two trees' scans disagree"
        print(f"  baseline ({args.baseline_src}): {base['scan_cpu_s']:.2f} CPU s")
        print(f"  keeping the sums: {branch['scan_cpu_s'] / base['scan_cpu_s'] - 1:+.1%} (no extra forward pass)")
    print(f"  intervals and stability (1000 resamples): {branch['intervals_cpu_s']:.3f} CPU s")


if __name__ == "__main__":
    main()

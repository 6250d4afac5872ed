"""Time the model's forward plain, with an empty intervention, and with one hook on every layer, in one process, on the
same random weights (inference, no gradients). The runs interleave (plain, empty, hooked, plain, ...) so a shared
machine's load falls on each alike; the median of each counts.

Hooks: `resid` adds a zero vector to every layer's resid_post (the cheapest site); `z` passes every layer's attn.z
through a function that returns None; `q_input` does nothing at every layer's attn.q_input, which makes each layer
project its heads one by one (the per-head input path), so it shows that path's own cost.

    python scripts/bench_hooks.py [--device auto|cpu|cuda] [--repeats 30] [--batch 8] [--seq-len 128]
"""

import argparse
import statistics
import time

import torch

from headcount.model import AttentionConfig, ModelConfig, Transformer
from headcount.model.intervention import Intervention, add

LAYERS, HEADS, WIDTH, VOCAB = 4, 8, 256, 256


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu or cuda")
    parser.add_argument("--repeats", type=int, default=30, help="timed forwards per variant; the median counts")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


def timed(fn, device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=LAYERS, d_model=WIDTH, n_ctx=args.seq_len, vocab_size=VOCAB, mlp=True)
    cfg.attn = AttentionConfig(n_heads=HEADS)
    model = Transformer(cfg).to(args.device).eval()
    ids = torch.randint(0, VOCAB, (args.batch, args.seq_len), device=args.device)
    zero = torch.zeros(WIDTH, device=args.device)
    variants = {
        "plain": lambda: None,
        "empty intervention": lambda: Intervention(),
        "resid hook per layer": lambda: Intervention(
            [(f"blocks.{lay}.resid_post", add(zero)) for lay in range(LAYERS)]
        ),
        "z hook per layer": lambda: Intervention(
            [(f"blocks.{lay}.attn.z", lambda x, s: None) for lay in range(LAYERS)]
        ),
        "q_input hook per layer": lambda: Intervention(
            [(f"blocks.{lay}.attn.q_input", lambda x, s: None) for lay in range(LAYERS)]
        ),
    }
    times = {name: [] for name in variants}
    with torch.no_grad():
        expected = model(ids)
        for name, make in variants.items():  # warm up, and every variant gives the plain logits
            got = model(ids, intervention=make())
            assert torch.allclose(got, expected, atol=1e-5), name
        for _ in range(args.repeats):
            for name, make in variants.items():
                times[name].append(timed(lambda make=make: model(ids, intervention=make()), args.device))
    threads = torch.get_num_threads()
    print(
        f"forward: {LAYERS} layers x {HEADS} heads, width {WIDTH}, MLP on, {args.batch} x {args.seq_len} tokens, "
        f"float32, device {args.device}, {threads} threads, median of {args.repeats} (interleaved)"
    )
    plain = statistics.median(times["plain"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:24s} {median * 1e3:8.2f} ms  {100 * (median / plain - 1):+6.1f}% vs plain")


if __name__ == "__main__":
    main()

"""The circuits core's own forwards on random models, CPU seconds on one thread: the edge-patched forward with no edge
touched (node_outputs), with N rows of random edge weights (what exact scores and faithfulness run), and EAP's gradient
run (one forward and one backward through every receiver's tap, at the score points). Run it on two trees to compare
them (PYTHONPATH=<tree>/src), interleaved.

    python scripts/bench_edge_forward.py [--repeats 5] [--rows 8]

Two models: "gpt2" (6 layers x 8 heads, d_model 128, learned positions, MLPs) and "llama" (6 layers, 8 query heads
in 2 key/value groups, rotary positions, RMSNorm, gated MLPs), 4 prompts of 32 tokens.
"""

import argparse
import statistics
import time

import torch

from headcount.circuits.forward import edge_forward, node_outputs
from headcount.circuits.gradients import receiver_gradients
from headcount.circuits.graph import Graph
from headcount.circuits.metric import PointMetric
from headcount.config.model import AttentionConfig, ModelConfig
from headcount.model.transformer import Transformer

MODELS = {
    "gpt2": dict(positions="learned", norm="layernorm"),
    "llama": dict(positions="rotary", norm="rmsnorm", mlp_act="swiglu"),
}


def build(name: str) -> Transformer:
    torch.manual_seed(0)
    kv = 2 if name == "llama" else None
    attn = AttentionConfig(n_heads=8, n_kv_heads=kv)
    cfg = ModelConfig(d_model=128, n_ctx=64, n_layers=6, vocab_size=500, attn=attn, mlp=True, **MODELS[name])
    return Transformer(cfg).eval()


def cpu_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times)


def measure(name: str, rows: int, repeats: int) -> tuple[float, float, float]:
    """CPU seconds of the plain edge forward, of `rows` weighted rows and of EAP's gradient run on model `name`."""
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(0, 500, (4, 32), generator=g)
    corrupted = torch.randint(0, 500, (4, 32), generator=g)
    points = torch.zeros(4, 32, dtype=torch.bool)
    points[:, -1] = True
    metric = PointMetric(lambda logits_PV: logits_PV[:, 3] - logits_PV[:, 7])
    model = build(name)
    weights = torch.rand(rows, len(Graph.of(model).edges), generator=g)
    with torch.no_grad():
        target = node_outputs(model, corrupted)
        emb = model.embed(clean)
        plain = cpu_seconds(lambda: node_outputs(model, clean), repeats)
        weighted = cpu_seconds(lambda: edge_forward(model, emb, weights, target), repeats)
    grads = cpu_seconds(lambda: receiver_gradients(model, emb, points, metric), repeats)
    return plain, weighted, grads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name in MODELS:
        plain, weighted, grads = measure(name, args.rows, args.repeats)
        print(
            f"{name}: plain edge forward {plain:.4f} s, {args.rows} weighted rows {weighted:.4f} s, "
            f"EAP gradient run {grads:.4f} s (CPU, median of {args.repeats})",
            flush=True,
        )


if __name__ == "__main__":
    main()

"""Training throughput with and without head gates, against attention written with no gate machinery at all.

Same shapes, same weights, one process; the variants take turns so drift in machine load hits them alike.
    python scripts/bench_train.py                       # CPU row
    python scripts/bench_train.py --device cuda --dtype bf16 --compile --preset gpt2_small
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from headcount.model import AttentionConfig, ModelConfig, Transformer
from headcount.model.intervention import gated

PRESETS = {
    "cpu": dict(n_layers=4, d_model=256, n_heads=8, seq_len=128, batch=16),
    "gpt2_small": dict(n_layers=12, d_model=768, n_heads=12, seq_len=1024, batch=16),
}
# Peak dense bf16 tensor-core FLOP/s, for MFU.
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12}


class PlainAttention(nn.Module):
    """Multi-head attention as nanoGPT writes it: no gates, no replacements, no cache. It offers the two operations
    Block.forward calls without an intervention (heads, then combine_heads through Block.finish)."""

    def __init__(self, gated):
        super().__init__()
        self.qkv, self.out, self.n_heads, self.head_dim = gated.qkv, gated.out, gated.n_heads, gated.head_dim

    def heads(self, x, bias=None):  # bias: T5's relative bias, which a GPT-2 block never has
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)

    def combine_heads(self, z):
        return self.out(z.flatten(2))


def build(p: dict, plain: bool, device: str) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(
        n_layers=p["n_layers"],
        d_model=p["d_model"],
        n_ctx=p["seq_len"],
        vocab_size=256,
        attn=AttentionConfig(n_heads=p["n_heads"]),
        mlp=True,
    )
    model = Transformer(cfg)
    if plain:
        for block in model.blocks:
            block.attn = PlainAttention(block.attn)
    return model.to(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=PRESETS, default="cpu")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="bf16: autocast, as bf16-mixed")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    p = PRESETS[args.preset]
    B, T, L, H = p["batch"], p["seq_len"], p["n_layers"], p["n_heads"]
    dev = args.device
    idx = torch.randint(0, 256, (B, T + 1), device=dev)
    x, y = idx[:, :-1], idx[:, 1:]
    variants = {
        "plain attention (no gate code)": (build(p, True, dev), None),
        "headcount, no gates": (build(p, False, dev), None),
        "headcount, gates (L, H) = 1": (build(p, False, dev), torch.ones(L, H, device=dev)),
        "headcount, gates (B, L, H) = 1": (build(p, False, dev), torch.ones(B, L, H, device=dev)),
    }
    steps = {}
    for name, (model, gates) in variants.items():
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.startswith("cuda"))
        forward = torch.compile(model) if args.compile else model

        def step(model=model, forward=forward, gates=gates, opt=opt):
            with torch.autocast(dev.split(":")[0], torch.bfloat16, enabled=args.dtype == "bf16"):
                logits = forward(x) if gates is None else forward(x, gated(gates))
                loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        for _ in range(3):  # warm-up (and compilation)
            step()
        steps[name] = step

    def sync():
        if dev.startswith("cuda"):
            torch.cuda.synchronize()

    times = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            sync()
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            sync()
            times[name].append((time.perf_counter() - start) / args.steps)

    ref = variants["headcount, no gates"][0]
    flops = ref.flops_per_token(T) * B * T
    device_name = torch.cuda.get_device_name() if dev.startswith("cuda") else f"CPU, {torch.get_num_threads()} threads"
    peak = next((v for k, v in PEAK_FLOPS.items() if k in device_name), None)
    print(f"device: {device_name}; torch {torch.__version__}; dtype {args.dtype}; compile {args.compile}")
    print(f"model: {L} layers x {H} heads, width {p['d_model']}, batch {B} x {T} tokens; {ref.num_params():,} params")
    base = statistics.median(times["plain attention (no gate code)"])
    print(f"{'variant':34s} {'tokens/s':>12s} {'time vs plain':>14s}" + (f" {'MFU':>6s}" if peak else ""))
    for name, ts in times.items():
        t = statistics.median(ts)
        row = f"{name:34s} {B * T / t:12,.0f} {100 * (t / base - 1):+13.1f}%"
        print(row + (f" {100 * flops / t / peak:5.1f}%" if peak else ""))


if __name__ == "__main__":
    main()

"""Time an exact single-head zero-ablation scan three ways, in one process, on the same random weights.

(a) one forward pass per mask with a pre-hook on the attention output projection that zeroes head h of z, the way
    TransformerLens users ablate through hook_z; (b) headcount's MaskEvaluator, also with its reuse switched off
    step by step; (c) TransformerLens itself with copied weights, when it is installed (it is not a dependency).
All must agree; prints wall times, speedups and the FLOPs each way does.
--model smollm2 runs the real-model case instead (scripts/bench_smollm2.py): SmolLM2-135M's 270 heads against
transformers 5.x with an o_proj pre-hook, on the same weights.

    python scripts/bench_scan.py [--device auto|cpu|cuda] [--repeats 3]
    python scripts/bench_scan.py --model smollm2 [--n-seq 4] [--seq-len 128] [--heads-per-layer 9] [--repeats 1]
"""

import argparse
import time

import torch

from headcount.ablation.engine.evaluator import MaskEvaluator
from headcount.ablation.engine.masks import masks_to_gates, single_head_masks
from headcount.metrics import token_nll_and_correct
from headcount.model import AttentionConfig, ModelConfig, Transformer

LAYERS, HEADS, WIDTH, VOCAB = 4, 8, 256, 256
N_SEQ, SEQ_LEN, BATCH = 64, 128, 64


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu or cuda")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per method; the fastest counts")
    parser.add_argument("--model", default="tiny", choices=["tiny", "smollm2"], help="random 4x8 model or SmolLM2")
    parser.add_argument("--n-seq", type=int, default=4, help="smollm2: evaluation sequences (1-8)")
    parser.add_argument("--seq-len", type=int, default=128, help="smollm2: tokens per sequence")
    parser.add_argument("--heads-per-layer", type=int, default=9, help="smollm2: time the first K heads of each layer")
    args = parser.parse_args()
    if args.repeats is None:  # a full SmolLM2 scan one forward per head takes minutes on a CPU
        args.repeats = 1 if args.model == "smollm2" else 3
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


def make_model_and_batches(device: str) -> tuple[Transformer, list[dict]]:
    torch.manual_seed(0)
    cfg = ModelConfig(
        n_layers=LAYERS, d_model=WIDTH, n_ctx=SEQ_LEN, vocab_size=VOCAB, attn=AttentionConfig(n_heads=HEADS), mlp=True
    )
    model = Transformer(cfg).to(device).eval()
    input_ids = torch.randint(0, VOCAB, (N_SEQ, SEQ_LEN), generator=torch.Generator().manual_seed(1)).to(device)
    loss_mask = torch.ones_like(input_ids, dtype=torch.bool)
    loss_mask[:, 0] = False  # language modelling: every token is a target but the first
    batches = [
        {"input_ids": input_ids[i : i + BATCH], "loss_mask": loss_mask[i : i + BATCH]} for i in range(0, N_SEQ, BATCH)
    ]
    return model, batches


def masked_mean_loss(logits_BTV: torch.Tensor, batch: dict) -> tuple[float, int]:
    nll_BS, _ = token_nll_and_correct(logits_BTV, batch["input_ids"])
    target_BS = batch["loss_mask"][:, 1:]
    return float(nll_BS[target_BS].double().sum()), int(target_BS.sum())


@torch.no_grad()
def hook_loop(model: Transformer, batches: list[dict]) -> torch.Tensor:
    """One forward per head; the hook zeroes that head's slice of z where it enters W_o."""
    losses = []
    for block in model.blocks:
        for head in range(block.attn.n_heads):

            def zero_head(module, inputs, head=head, H=block.attn.n_heads, D=block.attn.head_dim):
                (z_BTX,) = inputs
                z_BTHD = z_BTX.view(*z_BTX.shape[:2], H, D).clone()
                z_BTHD[:, :, head] = 0
                return (z_BTHD.view_as(z_BTX),)

            handle = block.attn.out.register_forward_pre_hook(zero_head)
            try:
                sums = [masked_mean_loss(model(b["input_ids"]), b) for b in batches]
            finally:
                handle.remove()
            losses.append(sum(s for s, _ in sums) / sum(n for _, n in sums))
    return torch.tensor(losses, dtype=torch.float64)


def evaluator_scan(model: Transformer, batches: list[dict], **options) -> torch.Tensor:
    gates_MLH = masks_to_gates(single_head_masks(model.heads_per_layer), model.heads_per_layer)
    return MaskEvaluator(model, batches, **options).evaluate(gates_MLH)["loss"]


def transformer_lens_scan(model: Transformer, batches: list[dict]) -> torch.Tensor | None:
    try:
        from transformer_lens import HookedTransformer, HookedTransformerConfig
    except ImportError:
        return None
    cfg = model.cfg
    D = model.head_dim
    tl_cfg = HookedTransformerConfig(
        n_layers=cfg.n_layers,
        d_model=cfg.d_model,
        n_ctx=cfg.n_ctx,
        d_head=D,
        n_heads=cfg.attn.n_heads,
        d_mlp=cfg.mlp_ratio * cfg.d_model,
        d_vocab=cfg.vocab_size,
        act_fn="gelu",
        normalization_type="LN",
        positional_embedding_type="standard",
        device=str(next(model.parameters()).device),
    )
    tl_model = HookedTransformer(tl_cfg).eval()
    tl_model.load_state_dict(transformer_lens_state(model), strict=False)
    losses = []
    with torch.no_grad():
        for layer in range(cfg.n_layers):
            for head in range(cfg.attn.n_heads):

                def zero_head(z_BTHD, hook, head=head):
                    z_BTHD[:, :, head] = 0
                    return z_BTHD

                hooks = [(f"blocks.{layer}.attn.hook_z", zero_head)]
                sums = [masked_mean_loss(tl_model.run_with_hooks(b["input_ids"], fwd_hooks=hooks), b) for b in batches]
                losses.append(sum(s for s, _ in sums) / sum(n for _, n in sums))
    return torch.tensor(losses, dtype=torch.float64)


def transformer_lens_state(model: Transformer) -> dict[str, torch.Tensor]:
    """Our weights under TransformerLens's names and (head, in, out) layouts."""
    state = {
        "embed.W_E": model.tok_emb.weight,
        "pos_embed.W_pos": model.pos_emb.weight,
        "ln_final.w": model.ln_f.weight,
        "ln_final.b": model.ln_f.bias,
        "unembed.W_U": model.lm_head.weight.T,
        "unembed.b_U": torch.zeros(model.cfg.vocab_size),
    }
    for layer, block in enumerate(model.blocks):
        p = f"blocks.{layer}."
        state |= {
            f"{p}attn.{name}": getattr(block.attn, name)
            for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")
        }
        state |= {
            f"{p}ln1.w": block.ln_attn.weight,
            f"{p}ln1.b": block.ln_attn.bias,
            f"{p}ln2.w": block.ln_mlp.weight,
            f"{p}ln2.b": block.ln_mlp.bias,
            f"{p}mlp.W_in": block.mlp.fc.weight.T,
            f"{p}mlp.b_in": block.mlp.fc.bias,
            f"{p}mlp.W_out": block.mlp.proj.weight.T,
            f"{p}mlp.b_out": block.mlp.proj.bias,
        }
    return {name: tensor.detach().clone() for name, tensor in state.items()}


def layer_flops(model: Transformer, T: int) -> dict[str, float]:
    """Matmul FLOPs per token of one layer's parts (2 per multiply-add; attention over all T keys, as
    Transformer.flops_per_token counts it)."""
    C, HD = model.cfg.d_model, model.max_heads * model.head_dim
    hidden = model.cfg.mlp_ratio * C if model.cfg.mlp else 0
    return {"qkv": 2 * C * 3 * HD, "attention": 2 * 2 * T * HD, "out": 2 * HD * C, "mlp": 2 * 2 * C * hidden}


def scan_flops(model: Transformer, batches: list[dict], reuse: bool, prefix: bool) -> float:
    """FLOPs of the single-head scan as the evaluator runs it: one clean pass per batch, then per mask the layers from
    its own (prefix) and, with reuse, only the output projection and MLP of that first layer; targets only."""
    T = batches[0]["input_ids"].shape[1]
    parts = layer_flops(model, T)
    full_layer = sum(parts.values())
    tokens = sum(b["input_ids"].numel() for b in batches)
    targets = sum(int(b["loss_mask"][:, 1:].sum()) for b in batches)
    unembed = 2 * model.cfg.d_model * model.cfg.vocab_size
    L = model.n_layers
    flops = tokens * L * full_layer + targets * unembed  # the clean passes
    for layer, n_heads in enumerate(model.heads_per_layer):
        start = layer if prefix else 0
        layers = (L - start) * full_layer
        if reuse:
            layers -= parts["qkv"] + parts["attention"]
        flops += n_heads * (tokens * layers + targets * unembed)
    return flops


def per_mask_flops(model: Transformer, batches: list[dict]) -> float:
    T = batches[0]["input_ids"].shape[1]
    tokens = sum(b["input_ids"].numel() for b in batches)
    forward = model.n_layers * sum(layer_flops(model, T).values()) + 2 * model.cfg.d_model * model.cfg.vocab_size
    return sum(model.heads_per_layer) * tokens * forward


def best_time(fn, repeats: int, device: str) -> tuple[float, torch.Tensor]:
    times, result = [], None
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    args = parse_args()
    if args.model == "smollm2":
        from bench_smollm2 import main as smollm2_main  # scripts/ is on sys.path when this file runs as a script

        return smollm2_main(args.device, args.repeats, args.n_seq, args.seq_len, args.heads_per_layer)
    model, batches = make_model_and_batches(args.device)
    M = sum(model.heads_per_layer)
    print(
        f"single-head zero-ablation scan: {LAYERS} layers x {HEADS} heads = {M} masks, width {WIDTH}, MLP on, "
        f"{N_SEQ} x {SEQ_LEN} tokens, float32, device {args.device}, {torch.get_num_threads()} threads, "
        f"best of {args.repeats}"
    )
    methods = {
        "(a) hook loop, one forward per mask": (lambda: hook_loop(model, batches), per_mask_flops(model, batches)),
        "(b) evaluator, no reuse (batched only)": (
            lambda: evaluator_scan(model, batches, prefix_cache=False, clean_attention=False),
            scan_flops(model, batches, reuse=False, prefix=False),
        ),
        "(b) evaluator, prefix caching": (
            lambda: evaluator_scan(model, batches, clean_attention=False),
            scan_flops(model, batches, reuse=False, prefix=True),
        ),
        "(b) evaluator, prefix + clean attention": (
            lambda: evaluator_scan(model, batches),
            scan_flops(model, batches, reuse=True, prefix=True),
        ),
    }
    results = {}
    for name, (fn, flops) in methods.items():
        seconds, losses = best_time(fn, args.repeats, args.device)
        results[name] = (seconds, losses, flops)
    seconds, losses = best_time(lambda: transformer_lens_scan(model, batches), args.repeats, args.device)
    if losses is None:
        print("(c) TransformerLens: HookedTransformer not importable (not installed, or 4.x without it), skipped")
    else:
        results["(c) TransformerLens, hook_z"] = (seconds, losses, per_mask_flops(model, batches))

    reference_seconds, reference, reference_flops = results["(a) hook loop, one forward per mask"]
    print(f"{'method':42s} {'wall s':>8s} {'speedup':>8s} {'GFLOP':>8s} {'FLOP ratio':>10s} {'max |dloss|':>12s}")
    for name, (seconds, losses, flops) in results.items():
        diff = (losses.double().cpu() - reference).abs().max().item()
        print(
            f"{name:42s} {seconds:8.2f} {reference_seconds / seconds:7.2f}x {flops / 1e9:8.1f} "
            f"{flops / reference_flops:10.3f} {diff:12.2e}"
        )


if __name__ == "__main__":
    main()

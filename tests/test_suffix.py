"""Masked passes that run only the positions a mask can change (model/suffix.py, the evaluator's `skip_unchanged`)
give the plain evaluator's numbers, in float64 to 1e-10, on every family the tests build (sliding windows, soft-caps,
post-norms, grouped and multi-query attention, rotary scalings, learned and shortformer positions, parallel
residuals, summed heads), in patch, denoise-like, zero and per-position mean modes, with prompts whose first
difference is at the start, in the middle and at the scored last token, and per-example score points."""

import pytest
import torch

pytest.importorskip("transformers")

import family_cases  # noqa: E402
import pretrained_helpers  # noqa: E402

from headcount.ablation.engine.evaluator import MaskEvaluator  # noqa: E402
from headcount.ablation.engine.masks import masks_to_gates, single_head_masks  # noqa: E402
from headcount.ablation.engine.metrics import METRICS  # noqa: E402
from headcount.ablation.engine.modes import MODES, Replacements  # noqa: E402
from headcount.model import AttentionConfig, ModelConfig, Transformer  # noqa: E402
from headcount.model.suffix import SuffixLayout  # noqa: E402
from headcount.pretrained import convert  # noqa: E402

T = 12


def family_model(case: str) -> Transformer:
    module = family_cases if case in family_cases.CASES else pretrained_helpers
    return convert(module.hf_model(case)).to(torch.float64).eval()


def native_model(**changes) -> Transformer:
    torch.manual_seed(0)
    attn = AttentionConfig(
        n_heads=4, n_kv_heads=changes.pop("n_kv_heads", None), combine=changes.pop("combine", "concat")
    )
    cfg = ModelConfig(n_layers=3, d_model=32, n_ctx=16, vocab_size=50, attn=attn, **changes)
    model = Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return model.to(torch.float64).eval()


NATIVE = {
    "shortformer": dict(positions="shortformer"),
    "learned_sum_heads": dict(positions="learned", combine="sum"),
    "rotary_parallel_gqa": dict(positions="rotary", parallel_residual=True, norm="rmsnorm", n_kv_heads=2),
}
MODELS = [*pretrained_helpers.CASES, *family_cases.CASES, *NATIVE]


def model_of(name: str) -> Transformer:
    return native_model(**NATIVE[name]) if name in NATIVE else family_model(name)


def patch_batch(first_diff: list[int], last: list[int], vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Prompts of T tokens whose corrupted counterpart first differs at first_diff[b] (and differs at random later
    positions too), scored at position last[b] (later positions are right padding)."""
    g = torch.Generator().manual_seed(seed)
    B = len(first_diff)
    ids = torch.randint(0, vocab, (B, T), generator=g)
    source = torch.randint(0, vocab, (B, T), generator=g)
    for b, p in enumerate(first_diff):
        source[b, :p] = ids[b, :p]
        source[b, p] = (ids[b, p] + 1) % vocab
    score = torch.zeros(B, T, dtype=torch.bool)
    score[torch.arange(B), torch.tensor(last)] = True
    answer = torch.randint(0, vocab, (B, T), generator=g)
    wrong = (answer + 1 + torch.randint(0, vocab - 1, (B, T), generator=g)) % vocab
    return {"input_ids": ids, "source_ids": source, "score_mask": score, "answer_ids": answer, "wrong_ids": wrong}


# First differences at the start, in the middle and at the scored last token, per example.
LAYOUTS = {"start": ([0, 0], [11, 9]), "middle": ([5, 3], [11, 8]), "last": ([11, 7], [11, 7])}


def scan(model, batch, mode="patch", **switches) -> torch.Tensor:
    gates = masks_to_gates(single_head_masks(model.heads_per_layer), model.heads_per_layer)
    gates = torch.cat([gates, gates[:2] * 0.3, torch.zeros(1, *gates.shape[1:])])  # fractional and every head
    if mode == "mean":
        torch.manual_seed(1)
        means = [torch.randn(T, n, model.head_dim, dtype=torch.float64) for n in model.heads_per_layer]
        replacements = Replacements(MODES["mean"](), means=means)
    else:
        replacements = Replacements(MODES[mode]())
    batch = batch if mode == "patch" else {k: v for k, v in batch.items() if k != "source_ids"}
    evaluator = MaskEvaluator(model, [batch], replacements, metric=METRICS["logit_diff"](), **switches)
    return evaluator, evaluator.evaluate(gates)["logit_diff"]


@pytest.mark.parametrize("where", list(LAYOUTS))
@pytest.mark.parametrize("name", MODELS)
def test_patch_scan_at_the_changed_positions_equals_the_plain_scan(name, where):
    model = model_of(name)
    batch = patch_batch(*LAYOUTS[where], model.cfg.vocab_size)
    fast, got = scan(model, batch)
    if where != "start":
        assert fast.layout(batch) is not None  # the test exercises the skipping, not the plain path
    _, expected = scan(model, batch, skip_unchanged=False)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)
    assert got.std() > 1e-3  # masks move the metric: an equality of constants would prove nothing


@pytest.mark.parametrize("mode", ["zero", "mean"])
@pytest.mark.parametrize("name", ["gemma2", "gemma3", "llama_gqa_untied", "shortformer"])
def test_zero_and_mean_scans_skip_only_the_positions_after_the_last_scored(name, mode):
    model = model_of(name)
    batch = patch_batch([0, 0], [6, 4], model.cfg.vocab_size)
    fast, got = scan(model, batch, mode)
    layout = fast.layout(batch)
    assert layout is not None and layout.start_B.tolist() == [0, 0] and layout.end_B.tolist() == [7, 5]
    _, expected = scan(model, batch, mode, skip_unchanged=False)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", ["gemma2", "llama_gqa_untied", "gpt2_tied"])
def test_without_clean_attention_or_prefix_cache_the_skipping_still_agrees(name):
    model = model_of(name)
    batch = patch_batch(*LAYOUTS["middle"], model.cfg.vocab_size)
    _, expected = scan(model, batch, skip_unchanged=False)
    for switches in ({"clean_attention": False}, {"prefix_cache": False, "clean_attention": False}):
        _, got = scan(model, batch, **switches)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)


def test_float32_agrees_to_float32_rounding():
    model = family_model("gemma3").float()
    batch = patch_batch(*LAYOUTS["middle"], model.cfg.vocab_size)
    _, got = scan(model, batch)
    _, expected = scan(model, batch, skip_unchanged=False)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_layout_runs_from_the_first_difference_to_the_last_score_point():
    model = native_model(positions="learned")
    batch = patch_batch([5, 3], [11, 8], model.cfg.vocab_size)
    evaluator = MaskEvaluator(model, [batch], Replacements(MODES["patch"]()), metric=METRICS["logit_diff"]())
    layout = evaluator.layout(batch)
    assert layout.start_B.tolist() == [5, 3] and layout.end_B.tolist() == [12, 9] and layout.S == 7
    assert layout.positions_BS.tolist() == [[5, 6, 7, 8, 9, 10, 11], [3, 4, 5, 6, 7, 8, 9]]
    # Skipping saves less than a quarter of the positions: the plain pass.
    assert evaluator.layout(patch_batch([1, 1], [11, 11], model.cfg.vocab_size)) is None


def test_layout_keys_are_causal_within_the_window_and_hide_recomputed_clean_positions():
    layout = SuffixLayout(torch.tensor([2]), torch.tensor([5]), 6)
    allowed = layout.allowed_BSK(window=2)[0].int().tolist()
    # keys: clean positions 0..5, then slots at positions 2, 3, 4
    assert allowed == [
        [0, 1, 0, 0, 0, 0, 1, 0, 0],  # position 2 sees clean 1 and itself
        [0, 0, 0, 0, 0, 0, 1, 1, 0],  # position 3 sees slots 2, 3
        [0, 0, 0, 0, 0, 0, 0, 1, 1],
    ]


@pytest.mark.parametrize("name", ["gemma3", "llama_gqa_untied", "olmo2", "shortformer"])
def test_denoising_scan_built_as_the_session_builds_it_skips_and_agrees(name):
    """patch_direction=denoise: the corrupted prompts run, the clean prompts' z patched in (modes.Patch.prepare);
    the prompts of a pair agree up to the changed token, so the pass skips the prefix there too."""
    from headcount.ablation.engine.evaluation import task_evaluation_set
    from headcount.config.ablation import AblationConfig
    from headcount.config.task import TaskConfig
    from headcount.data.examples import to_batches
    from headcount.tasks import IdsOnly, TaskPrompt
    from headcount.tasks.encode import encode_task

    model = model_of(name)
    vocab = model.cfg.vocab_size
    g = torch.Generator().manual_seed(2)
    prompts = []
    for i in range(4):
        ids = torch.randint(0, vocab, (T - i % 2,), generator=g).tolist()
        corrupted = list(ids)
        corrupted[len(ids) - 4] = (corrupted[len(ids) - 4] + 1) % vocab  # IOI-like: the change near the end
        answer, wrong = torch.randperm(vocab, generator=g)[:2].tolist()
        prompts.append(TaskPrompt(ids, [answer], [wrong], corrupted))
    task = encode_task(prompts, "toy", IdsOnly(vocab, "a test"), TaskConfig(source="file", path="t.jsonl"), T, "p")
    s = AblationConfig(mode="patch", patch_direction="denoise")
    data = task_evaluation_set(task, s, MODES["patch"]())
    replacements = MODES["patch"]().prepare(s, model, data, None)
    assert torch.equal(data.examples["input_ids"], task.corrupted_ids[:, : data.examples["input_ids"].shape[1]])
    batches = to_batches(data.examples, 4, torch.device("cpu"))
    gates = masks_to_gates(single_head_masks(model.heads_per_layer), model.heads_per_layer)
    values = {}
    for skip in (True, False):
        evaluator = MaskEvaluator(model, batches, replacements, metric=METRICS["logit_diff"](), skip_unchanged=skip)
        assert (evaluator.layout(batches[0]) is not None) == skip
        values[skip] = evaluator.evaluate(gates)["logit_diff"]
    torch.testing.assert_close(values[True], values[False], rtol=0, atol=1e-10)
    assert values[False].std() > 1e-3


@pytest.mark.parametrize("name", ["gemma2", "gemma3", "llama_gqa_untied", "olmo2", "shortformer", "learned_sum_heads"])
def test_the_last_layer_runs_from_the_first_point_and_several_points_agree(name):
    """The last layer's output counts at the score points only: a pass runs it from each example's first point on
    (SuffixLayout.from_first_point); several points per example, one before the first difference, one not at the end."""
    model = model_of(name)
    batch = patch_batch([5, 3], [11, 8], model.cfg.vocab_size)
    batch["score_mask"][0, [2, 7, 9]] = True
    batch["score_mask"][1, 6] = True
    fast, got = scan(model, batch)
    layout = fast.layout(batch)
    last, slots = layout.from_first_point(batch["score_mask"])
    assert (
        last.start_B.tolist() == [7, 6]
        and last.end_B.tolist() == [12, 9]
        and slots.tolist() == [[2, 3, 4, 5, 6], [3, 4, 5, 6, 6]]
    )
    _, expected = scan(model, batch, skip_unchanged=False)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", ["rotary_parallel_gqa", "shortformer"])
def test_aligned_patching_gates_only_its_positions_in_the_last_layers_cut(name):
    """Aligned patching (source_pos) gates only the aligned positions: the last layer's cut from the first score point
    takes those positions (and the per-position replacements) at its own slots."""
    model = model_of(name)
    batch = patch_batch([0, 0], [8, 6], model.cfg.vocab_size)
    batch["score_mask"][0, 5] = True
    source_pos = torch.arange(T).repeat(2, 1)
    source_pos[0, [6, 8]] = -1
    source_pos[1, 5] = -1
    batch["source_pos"] = source_pos
    fast, got = scan(model, batch)
    layout = fast.layout(batch)
    assert layout is not None and layout.from_first_point(batch["score_mask"])[0].start_B.tolist() == [5, 6]
    _, expected = scan(model, batch, skip_unchanged=False)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)

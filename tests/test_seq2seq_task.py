"""An encoder-decoder's task (tasks/translation_verb.py) and what needs it: mode=patch over every kind of head, the
metrics that read wrong answers, the clean-to-corrupted gap. Every number is checked against a forward written here:
the generator's prompts against the language's own rules, a patched head against torch hooks on the output
projection of that head's attention module, the gap's ends against plain forwards of the clean and corrupted sources,
in float32 and float64."""

import copy
import dataclasses

import numpy as np
import pytest
import torch
from seq2seq_cases import tiny_seq2seq

from headcount.ablation.encoder_checks import refuse_decoder_only
from headcount.ablation.engine.evaluation import counterpart_sums, evaluation, task_evaluation_set
from headcount.ablation.engine.masks import masks_to_gates, requested_masks, single_head_masks
from headcount.ablation.engine.metrics import resolve_metric
from headcount.ablation.engine.modes import MODES, mean_z
from headcount.ablation.seq2seq_checks import refuse_one_stack_only, takes
from headcount.ablation.session import typed_ablation
from headcount.config.ablation import AblationConfig
from headcount.config.task import TaskConfig
from headcount.data.examples import to_batches
from headcount.data.synthetic import BOS
from headcount.data.translation import NOUN, OBJ, VERB, Lexicon, translation_pairs
from headcount.errors import ConfigError
from headcount.model.encoder_decoder import EncoderDecoder
from headcount.tasks import IdsOnly, build_task

CPU = torch.device("cpu")
DTYPES = [torch.float32, torch.float64]
TOLERANCE = {torch.float32: 2e-5, torch.float64: 1e-10}
VOCAB, N_CTX = 60, 16


def verb_task(n: int = 10, seed: int = 0, source: str = "translation_seq2seq"):
    tokens = IdsOnly(VOCAB, f"the model reads the synthetic alphabet of data.source={source}", source)
    return build_task(TaskConfig(source="translation_verb", n_prompts=n, seed=seed), tokens, N_CTX)


def tiny_model(dtype: torch.dtype, seed: int = 0) -> EncoderDecoder:
    """seq2seq_cases' tiny encoder-decoder with the translation task's vocabulary."""
    return tiny_seq2seq(dtype, seed, n_ctx=N_CTX, vocab_size=VOCAB)


def test_each_prompt_is_a_sentence_scored_at_its_verb_and_the_counterpart_swaps_the_source_verb_alone():
    task, lex = verb_task(12), Lexicon.for_vocab(VOCAB)
    assert task.seq2seq and task.has_wrong and task.has_corrupted
    for i in range(len(task)):
        S, T = int(task.src_lengths[i]), int(task.lengths[i])
        src, bad = task.src_ids[i, :S], task.corrupted_src_ids[i, :S]
        differ = (src != bad).nonzero().flatten().tolist()
        assert len(differ) == 1  # one source token, the verb: same number, another lemma
        verb = int(differ[0])
        assert lex.src_verb <= int(src[verb]) < lex.src_prep and lex.src_verb <= int(bad[verb]) < lex.src_prep
        assert int(src[verb]) % 2 == int(bad[verb]) % 2 and int(src[verb]) != int(bad[verb])
        assert torch.equal(task.input_ids[i], task.corrupted_ids[i])  # the decoder's stream is the same
        assert int(task.input_ids[i, 0]) == BOS and T == S  # start, then the target's words before the verb
        assert task.score_mask[i].nonzero().flatten().tolist() == [T - 1]
        # the language's rules, read off the source: the verb's lemma, its subject's number, its object's gender
        nouns = [int(t) for t in src if lex.src_noun <= int(t) < lex.src_adj]
        object_lemma = (nouns[1] - lex.src_noun) // 2  # the second noun is the object's (SVO)
        gender = int(lex.genders[object_lemma])
        for ids, scored in ((src, task.answer_ids), (bad, task.wrong_ids)):
            lemma, number = divmod(int(ids[verb]) - lex.src_verb, 2)
            assert int(scored[i, T - 1]) == lex.tgt_verb + 4 * lemma + 2 * number + gender
    assert len(task.src_ids.unique()) > 5 and task.src_lengths.unique().numel() > 1


def translate(source: list[int], lex: Lexicon) -> tuple[list[int], int]:
    """The target's words before the verb, and the verb, by the language's rules (data/translation.py), written here
    from the source alone: NP V NP [P NP] -> NP' NP' [NP' P'] V', each NP' = Det' N' Adj'*; Det' carries its noun's
    gender and number, Adj' its noun's gender, V' its subject's number and its object's gender."""
    phrases, verb, prep, i = [], None, None, 0
    while i < len(source):
        token = source[i]
        if lex.src_det <= token < lex.src_noun:  # a noun phrase: det, adjectives, noun
            j = i + 1
            while lex.src_adj <= source[j] < lex.src_verb:
                j += 1
            phrases.append((source[i], source[i + 1 : j], source[j]))
            i = j + 1
            continue
        if lex.src_verb <= token < lex.src_prep:
            verb = token
        else:
            prep = token
        i += 1
    out, genders = [], []
    for det, adjectives, noun in phrases:
        d, m = divmod(det - lex.src_det, 2)
        lemma = (noun - lex.src_noun) // 2
        g = int(lex.genders[lemma])
        genders.append(g)
        out += [lex.tgt_det + 4 * d + 2 * g + m, lex.tgt_noun + 2 * lemma + m]
        out += [lex.tgt_adj + 2 * (a - lex.src_adj) + g for a in adjectives]
    if prep is not None:
        out.append(lex.tgt_post + prep - lex.src_prep)
    lemma, m = divmod(verb - lex.src_verb, 2)
    return out, lex.tgt_verb + 4 * lemma + 2 * m + genders[1]


@pytest.mark.parametrize("source", ["translation_verb", "translation_agreement"])
def test_both_runs_decoder_streams_answers_and_wrong_answers_are_the_languages_translations(source):
    """Each prompt's stream is the translation of its source up to the verb, the answer that source's verb; the
    counterpart's stream is the translation of the corrupted source, the wrong answer its verb; one source token
    differs (the verb for translation_verb, the object's noun, of the other gender, for translation_agreement)."""
    tokens = IdsOnly(VOCAB, "the synthetic alphabet", "translation_seq2seq")
    task, lex = build_task(TaskConfig(source=source, n_prompts=16), tokens, N_CTX), Lexicon.for_vocab(VOCAB)
    streams_differ = 0
    for i in range(len(task)):
        S, T = int(task.src_lengths[i]), int(task.lengths[i])
        src, bad = task.src_ids[i, :S].tolist(), task.corrupted_src_ids[i, :S].tolist()
        (words, verb), (bad_words, bad_verb) = translate(src, lex), translate(bad, lex)
        assert task.input_ids[i, :T].tolist() == [BOS, *words] and task.corrupted_ids[i, :T].tolist() == [
            BOS,
            *bad_words,
        ]
        assert int(task.answer_ids[i, T - 1]) == verb and int(task.wrong_ids[i, T - 1]) == bad_verb != verb
        (at,) = [k for k in range(S) if src[k] != bad[k]]
        kind = (lex.src_verb, lex.src_prep) if source == "translation_verb" else (lex.src_noun, lex.src_adj)
        assert kind[0] <= src[at] < kind[1] and src[at] % 2 == bad[at] % 2  # the same number
        streams_differ += words != bad_words
    assert streams_differ == (0 if source == "translation_verb" else len(task))


def test_the_prompts_follow_the_seed_and_are_the_generators_sentences():
    assert verb_task(6).fingerprint() == verb_task(6).fingerprint()
    assert verb_task(6).fingerprint() != verb_task(6, seed=1).fingerprint()
    task = verb_task(6)
    other = dataclasses.replace(task, corrupted_src_ids=task.corrupted_src_ids.roll(1, 0))  # only the sources differ
    assert other.fingerprint() != task.fingerprint()
    assert dataclasses.replace(task, src_ids=other.corrupted_src_ids).fingerprint() != task.fingerprint()
    first = task.first(3)
    assert torch.equal(first.src_ids, task.src_ids[:3]) and torch.equal(first.src_lengths, task.src_lengths[:3])
    assert torch.equal(first.examples(corrupted=True)["src_ids"], task.corrupted_src_ids[:3])
    pairs = translation_pairs(np.random.default_rng(0), 6, VOCAB)
    task = verb_task(6)
    for i in range(6):
        S = int(pairs.source_lengths[i])
        assert task.src_ids[i, :S].tolist() == pairs.source[i, :S].tolist()
        assert [VERB] == [r for r in pairs.roles[i, :S].tolist() if r == VERB]
        assert (pairs.roles[i] == NOUN).sum() >= 2 and OBJ in pairs.phrases[i].tolist()
        assert int(task.answer_ids[i, S - 1]) == int(pairs.target[i, S - 1])  # the target's verb, before EOS


def logit_diff_by_hand(model: EncoderDecoder, src, keep, tgt, task, patch=None) -> float:
    """The mean over prompts of logit(answer) - logit(wrong) at each scored position, from the model's forward with
    `patch` hooks (module, hook) registered as forward pre-hooks."""
    handles = [module.register_forward_pre_hook(hook) for module, hook in (patch or [])]
    try:
        with torch.no_grad():
            logits = model(src, tgt, src_keep=keep)
    finally:
        for handle in handles:
            handle.remove()
    where = task.score_mask
    at = logits[where]
    answer, wrong = task.answer_ids[where], task.wrong_ids[where]
    return float((at.gather(1, answer[:, None]) - at.gather(1, wrong[:, None])).double().mean())


def hand_patch(model: EncoderDecoder, task, kind: str, layer: int, head: int) -> float:
    """Head (kind, layer, head) patched by hand: the corrupted run's input to that attention module's output
    projection captured with a forward pre-hook, then its slice of the head written into the clean run's."""
    module = model.attention(kind, layer).out
    D = model.attention(kind, layer).head_dim
    captured = {}

    def capture(_module, args):
        captured["z"] = args[0].detach().clone()

    def write(_module, args):
        z = args[0].clone()
        z[..., head * D : (head + 1) * D] = captured["z"][..., head * D : (head + 1) * D]
        return (z,)

    clean, bad = task.examples(), task.examples(corrupted=True)
    logit_diff_by_hand(model, bad["src_ids"], bad["src_mask"], bad["input_ids"], task, [(module, capture)])
    return logit_diff_by_hand(model, clean["src_ids"], clean["src_mask"], clean["input_ids"], task, [(module, write)])


def patch_evaluation(model: EncoderDecoder, task, direction: str = "noise", metric: str = "logit_diff"):
    settings = AblationConfig(mode="patch", patch_direction=direction, batch_size=4, masks_per_pass=3)
    mode = MODES.get("patch")()
    data = task_evaluation_set(task, settings, mode)
    measure = resolve_metric(metric, task.has_wrong, task=True)
    return evaluation(settings, mode, measure, model, data, None, CPU).evaluator, data, measure, settings


def other_streams(task):
    """The task with counterparts whose decoder streams differ too (each prompt's second token replaced), so that a
    dec or cross head's patch reads a corrupted run of other tokens on both stacks."""
    streams = task.corrupted_ids.clone()
    streams[:, 1] = (streams[:, 1] + 1) % VOCAB
    return dataclasses.replace(task, corrupted_ids=streams)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("streams", ["same", "other", "translation_agreement"])
def test_patching_an_enc_a_dec_and_a_cross_head_equals_torch_hooks_on_its_output_projection(dtype, streams):
    model, task = tiny_model(dtype), verb_task(10)
    task = task if streams == "same" else other_streams(task)
    if streams == "translation_agreement":  # the counterpart's own translation: its decoder stream differs
        tokens = IdsOnly(VOCAB, "the synthetic alphabet", "translation_seq2seq")
        task = build_task(TaskConfig(source=streams, n_prompts=10), tokens, N_CTX)
    evaluator, *_ = patch_evaluation(model, task)
    grid = model.heads_per_layer
    masks = requested_masks(["enc.L0H1", "enc.L1H2", "dec.L1H0", "cross.L0H1", "cross.L1H0"], grid)
    got = evaluator.evaluate(masks_to_gates(masks, grid, dtype))["logit_diff"].tolist()
    expected = [hand_patch(model, task, m.kind, m.layer, m.head) for m in masks]
    assert got == pytest.approx(expected, abs=TOLERANCE[dtype])
    clean = task.examples()
    baseline = logit_diff_by_hand(model, clean["src_ids"], clean["src_mask"], clean["input_ids"], task)
    assert evaluator.baseline()["logit_diff"] == pytest.approx(baseline, abs=TOLERANCE[dtype])
    assert all(abs(g - baseline) > 1e-4 for g in got)  # each patch moves the metric: the comparison can fail


@pytest.mark.parametrize("dtype", DTYPES)
def test_patching_every_cross_head_is_the_corrupted_run_and_the_clean_runs_own_activations_change_nothing(dtype):
    """The decoder reads the source only through cross-attention, and the two runs' decoder streams are the same
    tokens: with every cross-attention head's z the corrupted run's, every later activation of the decoder is the
    corrupted run's too, so the metric is the corrupted run's exactly (so with every dec and cross head, and every
    head of every kind). The encoder's heads alone are not: its residual stream still carries the clean source's
    token embeddings."""
    model, task = tiny_model(dtype), verb_task(10)
    evaluator, data, metric, settings = patch_evaluation(model, task)
    grid = model.heads_per_layer
    corrupted = counterpart_sums(settings, metric, model, data, CPU).baseline["logit_diff"]
    bad = task.examples(corrupted=True)
    assert corrupted == pytest.approx(
        logit_diff_by_hand(model, bad["src_ids"], bad["src_mask"], bad["input_ids"], task), abs=TOLERANCE[dtype]
    )
    kinds = {kind: [f"{kind}.L{layer}H{h}" for layer, n in enumerate(per_layer) for h in range(n)]
             for kind, per_layer in model.kind_heads_per_layer.items()}  # fmt: skip
    names = ["+".join(kinds["cross"]), "+".join(kinds["dec"] + kinds["cross"]), "+".join(sum(kinds.values(), []))]
    got = evaluator.evaluate(masks_to_gates(requested_masks([*names, "+".join(kinds["enc"])], grid), grid, dtype))
    values = got["logit_diff"].tolist()
    assert values[:3] == pytest.approx([corrupted] * 3, abs=TOLERANCE[dtype])
    baseline = evaluator.baseline()["logit_diff"]
    assert abs(corrupted - baseline) > 1e-3 and abs(values[3] - corrupted) > 1e-4  # the gap exists; enc alone differs
    itself = dataclasses.replace(task, corrupted_src_ids=task.src_ids, corrupted_ids=task.input_ids)
    same, *_ = patch_evaluation(model, itself)
    masks = [*single_head_masks(grid), *requested_masks(names, grid)]
    unchanged = same.evaluate(masks_to_gates(masks, grid, dtype))["logit_diff"]
    assert unchanged.tolist() == pytest.approx([baseline] * len(masks), abs=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_denoising_patches_the_clean_run_into_the_corrupted_one(dtype):
    model, task = tiny_model(dtype), verb_task(8)
    evaluator, *_ = patch_evaluation(model, task, "denoise")
    swapped = dataclasses.replace(task, src_ids=task.corrupted_src_ids, corrupted_src_ids=task.src_ids)
    grid = model.heads_per_layer
    masks = requested_masks(["enc.L1H0", "dec.L0H2", "cross.L1H1"], grid)
    got = evaluator.evaluate(masks_to_gates(masks, grid, dtype))["logit_diff"].tolist()
    assert got == pytest.approx([hand_patch(model, swapped, m.kind, m.layer, m.head) for m in masks],
                                abs=TOLERANCE[dtype])  # fmt: skip


def test_the_task_on_a_model_without_a_source_and_a_decoders_task_here_are_one_line():
    settings = AblationConfig()
    for causal, model in ((True, "a decoder"), (False, "an encoder")):
        with pytest.raises(
            ConfigError,
            match=rf"^task.source='translation_verb': scores an encoder-decoder's target "
            rf"given a source \(model.encoder_layers > 0\); this model is {model}",
        ):
            refuse_decoder_only(settings, "translation_verb", causal)  # fmt: skip
    refuse_decoder_only(settings, "translation_verb", True, encoder_decoder=True)
    with pytest.raises(ConfigError, match=r"^task.source='ioi': a decoder's task scores a decoder's prompts; an "):
        refuse_one_stack_only(settings, "ioi")
    with pytest.raises(ConfigError, match=r"^task.source='translation_verb': writes the generated language's token "
                                          r"ids, for a model trained on data.source=translation_seq2seq; this model "
                                          r"reads translation$"):  # fmt: skip
        verb_task(4, source="translation")
    patch = typed_ablation({"mode": "patch", "metric": "logit_diff", "scans": {}})
    refuse_one_stack_only(patch, "translation_verb")  # what the task makes possible
    with pytest.raises(ConfigError, match=r"^ablation.mode='patch': an encoder-decoder is scored at its"):
        refuse_one_stack_only(patch, None)
    assert "with its tasks (translation_verb, translation_agreement) mode=patch" in takes()
    each = copy.copy(patch)
    each.patch_positions = "each"
    with pytest.raises(ConfigError, match=r"^ablation.patch_positions='each': an encoder-decoder's task names no"):
        refuse_one_stack_only(each, "translation_verb")


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_first_layer_decoder_head_patched_changes_nothing_its_inputs_are_the_same_tokens(dtype):
    """Decoder layer 0's self-attention reads the decoder's token embeddings alone, the same in both runs: its heads'
    z are the same, so patching them moves nothing; layer 1's reads cross-attention's output and does."""
    model, task = tiny_model(dtype), verb_task(10)
    evaluator, *_ = patch_evaluation(model, task)
    grid = model.heads_per_layer
    got = evaluator.evaluate(masks_to_gates(requested_masks(["dec.L0H0+dec.L0H1+dec.L0H2", "dec.L1H1"], grid), grid,
                                            dtype))["logit_diff"].tolist()  # fmt: skip
    baseline = evaluator.baseline()["logit_diff"]
    assert got[0] == pytest.approx(baseline, abs=TOLERANCE[dtype]) and abs(got[1] - baseline) > 1e-4


def test_attribution_patching_of_every_kind_equals_central_finite_differences_of_the_patched_metric():
    from headcount.ablation.methods.seq2seq_attribution import attribute_heads

    dtype = torch.float64
    model, task = tiny_model(dtype), verb_task(10)
    evaluator, data, metric, settings = patch_evaluation(model, task)
    mode = MODES.get("patch")()
    prepared = mode.prepare(settings, model, data, None)
    grid = model.heads_per_layer
    mask_LH = torch.full((len(grid), max(grid)), 0.5, dtype=dtype)  # an interior point: both sides of the gate exist
    attribution = attribute_heads(model, evaluator.batches, prepared, metric, mask_LH)
    eps = 1e-5
    for label in ("enc.L1H2", "dec.L1H0", "cross.L0H1"):
        row, head = requested_masks([label], grid)[0].heads_off[0]
        gates = mask_LH.repeat(2, 1, 1)
        gates[0, row, head], gates[1, row, head] = 0.5 + eps, 0.5 - eps
        up, down = evaluator.evaluate(gates)["logit_diff"].tolist()
        slope = (up - down) / (2 * eps)
        assert float(attribution.estimate_LH[row, head]) == pytest.approx(-slope, abs=1e-7), label
        assert abs(slope) > 1e-3  # the head moves the metric: the check binds


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from seq2seq_cases import trained_translation_run

    path = tmp_path_factory.mktemp("seq2seq_task_run")
    trained_translation_run(path)
    return path


def test_patch_scans_of_a_trained_encoder_decoder_name_kinds_and_give_the_gap(trained):
    """Run.scan on the task equals the patched forward by hand for a head of each kind, and gap_fraction is the delta
    over the gap between the plain forwards of the corrupted and clean sources."""
    import headcount

    run = headcount.load_run(trained, device="cpu")
    spec = {"source": "translation_verb", "n_prompts": 12}
    table = run.scan("single_head", mode="patch", task=spec)
    assert list(table.columns[:5]) == ["scan", "mask", "kind", "layer", "head"]
    assert table["kind"].value_counts().to_dict() == {"enc": 4, "dec": 4, "cross": 4}
    assert table["metric"].eq("logit_diff").all() and table["mode"].eq("patch").all()
    task = run.task(spec)
    clean, bad = task.examples(), task.examples(corrupted=True)
    baseline = logit_diff_by_hand(run.model, clean["src_ids"], clean["src_mask"], clean["input_ids"], task)
    corrupted = logit_diff_by_hand(run.model, bad["src_ids"], bad["src_mask"], bad["input_ids"], task)
    rows = table.set_index("mask")
    for label, kind, layer, head in (
        ("enc.L1H0", "enc", 1, 0),
        ("dec.L1H1", "dec", 1, 1),
        ("cross.L0H0", "cross", 0, 0),
    ):
        expected = hand_patch(run.model, task, kind, layer, head)
        assert rows.loc[label, "logit_diff"] == pytest.approx(expected, abs=1e-5)
        assert rows.loc[label, "delta_logit_diff"] == pytest.approx(expected - baseline, abs=1e-5)
        assert rows.loc[label, "gap_fraction"] == pytest.approx(
            (expected - baseline) / (corrupted - baseline), rel=1e-3
        )
    summary = run.summary("patch", "logit_diff", task="translation_verb")
    assert summary["counterpart"]["logit_diff"] == pytest.approx(corrupted, abs=1e-5)
    assert summary["baseline_logit_diff"] == pytest.approx(baseline, abs=1e-5)
    assert {"gap_fraction_ci_low", "gap_fraction_ci_high"} <= set(table.columns)
    evaluated = run.evaluate(["cross.L0H0"], mode="patch", task=spec).set_index("mask")
    assert evaluated.loc["cross.L0H0", "logit_diff"] == pytest.approx(rows.loc["cross.L0H0", "logit_diff"], abs=1e-6)
    mean = run.scan("layer", mode="mean", task=spec)
    assert mean["kind"].tolist() == ["enc", "enc", "dec", "dec", "cross", "cross"]


@pytest.mark.slow
def test_headcount_ablate_patches_an_encoder_decoder_on_its_task_from_the_command_line(trained, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    import pandas as pd

    script = Path(__file__).resolve().parents[1] / "scripts" / "ablate.py"
    args = [f"run_dir={trained}", "task=translation_verb", "task.n_prompts=12", "ablation.mode=patch",
            "ablation=[single_head]", "ablation.progress=false"]  # fmt: skip
    done = subprocess.run([sys.executable, str(script), *args], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    folder = trained / "ablation" / "tasks" / "translation_verb"
    table = pd.read_csv(folder / "single_head.patch.logit_diff.csv")
    assert table["mask"].tolist()[:2] == ["enc.L0H0", "enc.L0H1"] and set(table["kind"]) == {"enc", "dec", "cross"}
    assert (folder / "single_head.patch.logit_diff.png").exists()
    refused = subprocess.run(
        [sys.executable, str(script), f"run_dir={trained}", "task=ioi", "ablation.progress=false"],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "task.source='ioi': a decoder's task scores a decoder's prompts" in refused.stderr


@pytest.mark.parametrize("dtype", DTYPES)
def test_mean_and_resample_on_the_task_read_the_prompts_sources_and_decoder_tokens(dtype):
    """mean: each kind's z averaged over the tokens of the prompts (the source's for enc, the decoder stream's for dec
    and cross), by hand one prompt at a time; resample: every kind's z from the paired prompt's forward, its source
    and its decoder stream, and the patched metric equals the forward with those replacements."""
    model, task = tiny_model(dtype), verb_task(24)
    clean = task.examples()
    sums, counts = {}, {}
    for i in range(len(task)):
        S, T = int(task.src_lengths[i]), int(task.lengths[i])
        cache = {}
        with torch.no_grad():
            model(task.src_ids[i : i + 1, :S], task.input_ids[i : i + 1, :T], cache=cache)
        for name, z in cache.items():
            if name.endswith(".z"):
                sums[name] = sums.get(name, 0) + z[0].double().sum(0)
                counts[name] = counts.get(name, 0) + len(z[0])
    sites = [f"enc.blocks.{l}.attn.z" for l in range(2)] + [f"dec.blocks.{l}.attn.z" for l in range(2)]
    sites += [f"dec.blocks.{l}.cross.z" for l in range(2)]
    settings = AblationConfig(mode="mean", batch_size=5)
    data = task_evaluation_set(task, settings, MODES.get("mean")())
    means = mean_z(model, to_batches(data.reference, 5, CPU), False)
    for got, site in zip(means, sites, strict=True):
        assert torch.allclose(got.double(), sums[site] / counts[site], atol=TOLERANCE[dtype]), site
    task = verb_task(64)  # enough prompts that every length has a partner
    clean = task.examples()
    settings = AblationConfig(mode="resample", batch_size=16, masks_per_pass=2, seed=2)
    mode = MODES.get("resample")()
    data = task_evaluation_set(task, settings, mode)
    metric = resolve_metric("logit_diff", True, task=True)
    evaluator = evaluation(settings, mode, metric, model, data, None, CPU).evaluator
    source = (data.examples["source_ids"][:, None] == task.input_ids[None]).all(-1).float().argmax(1)
    assert torch.equal(data.examples["source_src_ids"], task.src_ids[source])
    assert (task.lengths[source] == task.lengths).all() and not torch.equal(source, torch.arange(len(task)))
    cache = {}
    with torch.no_grad():
        model(task.src_ids[source], task.input_ids[source], src_keep=clean["src_mask"][source], cache=cache)
    grid = model.heads_per_layer
    masks = requested_masks(["enc.L0H2", "dec.L1H1", "cross.L1H0"], grid)
    got = evaluator.evaluate(masks_to_gates(masks, grid, dtype))["logit_diff"].tolist()
    for mask, value in zip(masks, got):
        kind, layer, head = mask.kind, mask.layer, mask.head
        site = {"enc": "enc.blocks.{}.attn.z", "dec": "dec.blocks.{}.attn.z", "cross": "dec.blocks.{}.cross.z"}[kind]
        paired, width = cache[site.format(layer)], model.attention(kind, layer).head_dim

        def write(_module, args, D=width, z_from=paired, h=head):
            z = args[0].clone()
            z[..., h * D : (h + 1) * D] = z_from.flatten(2)[..., h * D : (h + 1) * D]
            return (z,)

        expected = logit_diff_by_hand(
            model, clean["src_ids"], clean["src_mask"], clean["input_ids"], task,
            [(model.attention(kind, layer).out, write)],
        )  # fmt: skip
        assert value == pytest.approx(expected, abs=TOLERANCE[dtype]), mask.name

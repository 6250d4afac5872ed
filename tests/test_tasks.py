"""Tasks: the built-in generators (one-token answers, equal-length corrupted prompts, seeded), the user's own prompt
files through `datasets`, the commands with a task, and every mistake a task can hold: one line, exit 2, nothing
written."""

import json
import logging
import shutil
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from sweep_helpers import SMOKE, command_in_process, one_line, smoke_run, train_in_process

from headcount.ablation.engine.metrics import METRICS
from headcount.ablation.records.address import ResultAddress
from headcount.ablation.scans import KINDS
from headcount.cli import ablate as ablating
from headcount.config.task import TaskConfig
from headcount.errors import ConfigError
from headcount.run_dir import RunPaths
from headcount.tasks import ByteTokens, HFTokens, IdsOnly, build_task
from headcount.tasks.ioi import NAMES

QUIET = ["ablation.progress=false", "trainer.progress_bar=false"]
LETTERS = list("ABCDEFGHIJ")


def gpt2_like_tokens() -> HFTokens:
    """A word-level transformers tokenizer in which " Mary" and the like are one token (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [" " + name for name in NAMES] + list("0123456789") + [" " + d for d in "0123456789"]
    vocab = {word: i for i, word in enumerate(["[UNK]", *dict.fromkeys(words)])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_next")
    return HFTokens(PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]"))


# --- generators ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tokens", ["bytes", "word-level"])
def test_ioi_names_and_answers_are_one_token_and_corrupted_prompts_keep_the_length(tokens):
    tokenizer = ByteTokens() if tokens == "bytes" else gpt2_like_tokens()
    cfg = TaskConfig(source="ioi", n_prompts=24, names=LETTERS if tokens == "bytes" else None)
    task = build_task(cfg, tokenizer, 256)
    assert len(task) == 24 and task.has_wrong and task.has_corrupted
    assert bool((task.corrupted_lengths == task.lengths).all())
    for i, text in enumerate(task.texts):
        n = int(task.lengths[i])
        answer, wrong = int(task.answer_ids[i, n - 1]), int(task.wrong_ids[i, n - 1])
        io, s1, s2 = (int(task.positions[name][i]) for name in ("IO", "S1", "S2"))
        # the named positions hold the names, one token each: the answer is IO's token, the wrong answer S's
        assert int(task.input_ids[i, io]) == answer and int(task.input_ids[i, s1]) == wrong
        assert int(task.input_ids[i, s2]) == wrong and int(task.corrupted_ids[i, s2]) not in (answer, wrong)
        differ = (task.input_ids[i, :n] != task.corrupted_ids[i, :n]).nonzero().flatten().tolist()
        assert differ == [s2]  # only S2 changed
        assert int(task.positions["S1+1"][i]) == s1 + 1 and int(task.positions["end"][i]) == n - 1
        decoded = tokenizer.decode([answer])
        assert decoded.strip() in (NAMES if tokens != "bytes" else LETTERS) and decoded.strip() in text
    again = build_task(cfg, tokenizer, 256)
    assert again.fingerprint() == task.fingerprint()  # seeded: the same prompts
    other = build_task(TaskConfig(**{**cfg.__dict__, "seed": 1}), tokenizer, 256)
    assert other.fingerprint() != task.fingerprint()


def test_ioi_refuses_names_that_are_not_one_token():
    with pytest.raises(ConfigError, match=r"task.names=.*needs 3 or more that are one token for bytes"):
        build_task(TaskConfig(source="ioi", n_prompts=4), ByteTokens(), 256)


@pytest.mark.parametrize("tokens", ["bytes", "byte-level BPE"])
def test_kv_retrieval_asks_for_a_key_whose_value_the_corrupted_prompt_changes(tokens):
    from headcount.pretrained.tiny_random import byte_tokenizer

    tokenizer = ByteTokens() if tokens == "bytes" else HFTokens(byte_tokenizer())
    task = build_task(TaskConfig(source="kv_retrieval", n_prompts=10, n_pairs=5), tokenizer, 512)
    assert bool((task.corrupted_lengths == task.lengths).all())
    for i in range(len(task)):
        n = int(task.lengths[i])
        answer, wrong = int(task.answer_ids[i, n - 1]), int(task.wrong_ids[i, n - 1])
        value = int(task.positions["value"][i])
        assert int(task.input_ids[i, value]) == answer and int(task.corrupted_ids[i, value]) == wrong
        assert answer != wrong and wrong not in task.input_ids[i, :n].tolist()  # the new value appears nowhere else
    assert build_task(TaskConfig(source="kv_retrieval", n_prompts=10, n_pairs=5), tokenizer, 512).fingerprint() == (
        task.fingerprint()
    )


# --- files ----------------------------------------------------------------------------------------------------------


def write_rows(path: Path, rows: list[dict]) -> Path:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    elif path.suffix == ".csv":
        pd.DataFrame(rows).to_csv(path, index=False)
    else:
        pd.DataFrame(rows).to_parquet(path)
    return path


TEXT_ROWS = [
    {"prompt": "ab ab a", "answer": "b", "wrong": "c", "corrupted": "ac ab a"},
    {"prompt": "xyz xyz xy", "answer": "z", "wrong": "q", "corrupted": "xyq xyz xy"},
]


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_a_prompts_file_of_each_format_reads_the_same(tmp_path, suffix):
    path = write_rows(tmp_path / f"prompts{suffix}", TEXT_ROWS)
    task = build_task(TaskConfig(source="file", path=str(path)), ByteTokens(), 64)
    assert task.name == "prompts" and task.texts == ["ab ab a", "xyz xyz xy"]
    assert task.answer_ids[task.score_mask].tolist() == [ord("b"), ord("z")]
    assert task.wrong_ids[task.score_mask].tolist() == [ord("c"), ord("q")]
    assert task.lengths.tolist() == [7, 10] and task.score_mask.sum(1).tolist() == [1, 1]


def test_id_prompts_positions_lists_and_whole_answers(tmp_path):
    rows = [{"prompt": [1, 2, 3, 4], "answer": [5, 6], "position": [1, -1]}]
    task = build_task(TaskConfig(source="file", path=str(write_rows(tmp_path / "ids.jsonl", rows))), IdsOnly(9, "x"), 8)
    assert task.score_mask[0].nonzero().flatten().tolist() == [1, 3]
    assert task.answer_ids[0, [1, 3]].tolist() == [5, 6]
    whole = TaskConfig(source="file", path=str(write_rows(tmp_path / "w.jsonl", [{"prompt": "ab", "answer": "cde"}])))
    whole.answer_tokens = "all"
    task = build_task(whole, ByteTokens(), 64)  # teacher-forced: "ab" + "cd", scored at 1, 2, 3
    assert task.input_ids[0].tolist() == [ord(c) for c in "abcd"]
    assert task.score_mask[0].nonzero().flatten().tolist() == [1, 2, 3]
    assert task.answer_ids[0, 1:4].tolist() == [ord(c) for c in "cde"]


def bos_first_tokenizer():
    """The byte tokenizer with a BOS its own encoding puts first, as Gemma's does."""
    from headcount.pretrained.tiny_random import byte_tokenizer

    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens({"bos_token": "<s>"})
    tokenizer._tokenizer.post_processor = __import__("tokenizers").processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", len(tokenizer) - 1)]
    )
    return tokenizer


def test_special_tokens_by_default_only_where_the_tokenizer_puts_a_bos_first_and_a_key_turns_them_off(tmp_path):
    from headcount.pretrained.tiny_random import byte_tokenizer

    tokenizer = bos_first_tokenizer()
    path = write_rows(tmp_path / "p.jsonl", [{"prompt": "ab", "answer": "c"}])
    default = build_task(TaskConfig(source="file", path=str(path)), HFTokens(tokenizer), 64)
    off = build_task(TaskConfig(source="file", path=str(path), add_special_tokens=False), HFTokens(tokenizer), 64)
    on = build_task(TaskConfig(source="file", path=str(path), add_special_tokens=True), HFTokens(tokenizer), 64)
    assert default.lengths.tolist() == on.lengths.tolist() == [3] and off.lengths.tolist() == [2]
    assert default.input_ids[0, 0] == on.input_ids[0, 0] == len(tokenizer) - 1
    assert default.fingerprint()["special_tokens"] is True and "special_tokens" not in off.fingerprint()
    assert default.first(1).special_tokens
    # A tokenizer without a BOS of its own (GPT-2's, SmolLM2's): as written by default, as before
    plain = build_task(TaskConfig(source="file", path=str(path)), HFTokens(byte_tokenizer()), 64)
    assert plain.lengths.tolist() == [2] and "special_tokens" not in plain.fingerprint()


BAD_FILES = [
    ([{"prompt": "ab"}], {}, "task.answer_field='answer': ", "has no such field (its fields: prompt)"),
    (
        [{"prompt": [1, 2], "answer": 300}],
        {},
        "task.path=",
        "prompt 0: the answer 300 is not in the model's vocabulary",
    ),
    ([], {}, "task.path=", "holds no prompts"),
    ([{"prompt": "abc", "answer": "d", "corrupted": "abcd"}], {}, "task.path=", "prompt 0: the clean prompt has 3 "),
    ([{"prompt": "abc", "answer": "d", "position": 5}], {}, "task.path=", "position 5 is outside its 3 tokens"),
    ([{"prompt": "a", "answer": "b"}, {"prompt": "a", "answer": "b", "wrong": "c"}], {}, "task.path=", "prompt 0: "),
]


@pytest.mark.parametrize("rows, extra, key, message", BAD_FILES)
def test_a_bad_prompts_file_is_one_config_error_naming_the_prompt(tmp_path, rows, extra, key, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(ConfigError) as error:
        build_task(TaskConfig(source="file", path=str(path), **extra), ByteTokens(), 64)
    assert str(error.value).startswith(key) and message in str(error.value), str(error.value)


def test_text_prompts_for_a_model_without_a_tokenizer_say_so(tmp_path):
    path = write_rows(tmp_path / "t.jsonl", TEXT_ROWS)
    with pytest.raises(ConfigError, match="is text, but the model reads .*give prompts and answers as token ids"):
        build_task(TaskConfig(source="file", path=str(path)), IdsOnly(64, "the model reads its synthetic alphabet"), 64)


# --- the commands -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A smoke run of headcount-train (synthetic induction data, token ids), and an id prompts file beside it."""
    root = tmp_path_factory.mktemp("task-run")
    smoke_run(pytest.MonkeyPatch, root)
    rows = [
        {"prompt": [0, 5, 9, 4, 5], "answer": 9, "wrong": 4, "corrupted": [0, 5, 7, 4, 5]},
        {"prompt": [0, 3, 8, 2, 6, 3], "answer": 8, "wrong": 2, "corrupted": [0, 3, 1, 2, 6, 3]},
        {"prompt": [0, 11, 12, 13, 11], "answer": 12, "wrong": 13, "corrupted": [0, 11, 14, 13, 11]},
    ]
    write_rows(root / "prompts.jsonl", rows)
    return root / "run"


def ablate_in_process(monkeypatch, cwd: Path, args: list[str]) -> int:
    return command_in_process(ablating.main, monkeypatch, cwd, args)


def test_a_prompts_file_scanned_in_patch_mode_from_the_command_line(finished_run, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    args = [f"run_dir={run}", "task=file", f"task.path={finished_run.parent / 'prompts.jsonl'}", *QUIET[:1]]
    args += ["ablation=[single_head,attribution]", "ablation.mode=patch", "ablation.metric=logit_diff"]
    assert ablate_in_process(monkeypatch, tmp_path, args) == 0
    folder = RunPaths(run).ablation / "tasks" / "prompts"
    table = pd.read_csv(folder / "single_head.patch.logit_diff.csv")
    assert len(table) == 8 and {"logit_diff", "delta_logit_diff", "gap_fraction"} <= set(table.columns)
    assert set(table["metric"]) == {"logit_diff"} and set(table["task"]) == {"prompts"}
    attribution = pd.read_csv(folder / "attribution.patch.logit_diff.csv")
    assert attribution["verified"].sum() == 8 and attribution["exact"].notna().all()
    assert (folder / "single_head.patch.logit_diff.png").stat().st_size > 1000
    assert not (RunPaths(run).ablation / "single_head.csv").exists()  # the run's own data results are apart
    capsys.readouterr()
    assert ablate_in_process(monkeypatch, tmp_path, args) == 0
    assert capsys.readouterr().err.count("up to date:") == 2


TASK_MISTAKES = [
    (["task=file", "task.path=missing.jsonl"], "task.path='missing.jsonl': no such file"),
    (["task=file", "task.path={prompts}", "ablation.metric=bogus"], "ablation.metric='bogus': allowed: loss,"),
    (
        ["task=file", "task.path={prompts}", "ablation.metric={{_target_:nowhere.metric}}"],
        "ablation.metric._target_='nowhere.metric': does not import as a function",
    ),
    (
        ["task=file", "task.path={nowrong}", "ablation.metric=logit_diff"],
        "ablation.metric='logit_diff': needs a wrong answer per prompt, and the task has none",
    ),
    (["task=file", "task.path={nowrong}", "ablation.mode=patch"], "ablation.mode='patch': needs corrupted prompts"),
    (["ablation.mode=patch"], "ablation.mode='patch': patches a task's corrupted prompts: name a task"),
    (
        ["task=file", "task.path={text}"],
        "task.path='text.jsonl': prompt 0: the prompt 'When Mary and John' is text, but",
    ),
    (
        ["task=file", "task.path={prompts}", "ablation=importance", "ablation.metric=top1"],
        "ablation.metric='top1': the importance scan (gradient importance) follows the metric's gradient",
    ),
    (["task=ioi"], "task.source='ioi': writes text prompts, but the model reads the synthetic alphabet"),
    (["task=file", "task.path={noanswer}"], "task.answer_field='answer': noanswer.jsonl has no such field"),
    (["task=file", "task.path={lengths}"], "task.path='lengths.jsonl': prompt 0: the clean prompt has 3 tokens"),
    (["task=file", "task.path={outside}"], "task.path='outside.jsonl': prompt 0: the answer 9999 is not in the model"),
    (["task=file", "task.path={empty}"], "task.path='empty.jsonl': holds no prompts"),
    (
        ["task=file", "task.path={prompts}", "ablation.split=test"],
        "ablation.split='test': a task is evaluated on its own prompts, never on a split of the run's data",
    ),
    (
        ["task=file", "task.path={prompts}", "ablation=position_attention"],
        "ablation.scans.position_attention='position_attention': reads a task's named positions, and task prompts "
        "names none but its end",
    ),
    (
        ["task=file", "task.path={prompts}", "ablation=direct_effect", "ablation.scans.direct_effect.backup_top_k=8"],
        "ablation.scans.direct_effect.backup_top_k=8: must be fewer than the model's 8 heads",
    ),
    (
        ["task=file", "task.path={prompts}", "ablation=top_heads", "ablation.scans.top_heads.rank_by=retrieval_scores"],
        "ablation.scans.top_heads.rank_by='retrieval_scores': cannot rank these heads: needs a copying task",
    ),
    # a prompts file scored before its end: patching each position patched only `end`, after it: every delta 0.0
    (
        ["task=file", "task.path={early}", "ablation.mode=patch", "ablation.patch_positions=each"],
        "ablation.patch_positions='each': the task's position 'end' is token 4 of prompt 0, after the token it scores",
    ),
    # a user's metric that raises, reads wrong answers the task has not, or returns NaN (written, then unreadable)
    (
        ["task=file", "task.path={prompts}", "ablation.metric={{_target_:test_tasks.raising_metric}}"],
        "ablation.metric._target_='test_tasks.raising_metric': raised ValueError: no good",
    ),
    (
        ["task=file", "task.path={nowrong}", "ablation.metric={{_target_:test_tasks.margin_metric}}"],
        "ablation.metric._target_='test_tasks.margin_metric': raised TypeError: ",
    ),
    (
        ["task=file", "task.path={prompts}", "ablation.metric={{_target_:test_tasks.nan_metric}}"],
        "ablation.metric._target_='test_tasks.nan_metric': returned 3 NaN or infinite value(s) of 3 score points",
    ),
]


def raising_metric(logits, answer_ids, wrong_ids):
    raise ValueError("no good")


def margin_metric(logits, answer_ids, wrong_ids):
    return logits.gather(1, answer_ids[:, None])[:, 0] - logits.gather(1, wrong_ids[:, None])[:, 0]


def nan_metric(logits, answer_ids, wrong_ids):
    return logits[:, 0] * float("nan")


@pytest.mark.parametrize("args, message", TASK_MISTAKES)
def test_a_task_mistake_is_one_line_and_writes_nothing(finished_run, tmp_path, monkeypatch, capsys, args, message):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    write_rows(tmp_path / "nowrong.jsonl", [{"prompt": [0, 1, 2], "answer": 3}])
    write_rows(tmp_path / "text.jsonl", [{"prompt": "When Mary and John", "answer": " Mary"}])
    write_rows(tmp_path / "noanswer.jsonl", [{"prompt": [0, 1, 2]}])
    write_rows(tmp_path / "lengths.jsonl", [{"prompt": [0, 1, 2], "answer": 3, "corrupted": [0, 1, 2, 4]}])
    write_rows(tmp_path / "outside.jsonl", [{"prompt": [0, 1, 2], "answer": 9999}])
    (tmp_path / "empty.jsonl").write_text("")
    early = {"prompt": [0, 5, 9, 4, 5], "answer": 9, "wrong": 4, "corrupted": [0, 7, 9, 4, 5], "position": -3}
    write_rows(tmp_path / "early.jsonl", [early])
    files = {"prompts": finished_run.parent / "prompts.jsonl", "nowrong": "nowrong.jsonl", "text": "text.jsonl"}
    files |= {name: f"{name}.jsonl" for name in ("noanswer", "lengths", "outside", "empty", "early")}
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    code = ablate_in_process(monkeypatch, tmp_path, [f"run_dir={run}", *(a.format(**files) for a in args)])
    line = one_line(capsys.readouterr().err)
    assert code == 2 and line.startswith(f"error: {message}"), line
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before  # nothing written, no log folder left


def test_training_checks_the_task_before_the_first_step(monkeypatch, tmp_path, capsys):
    args = [*SMOKE, *QUIET, "task=file", "task.path=nothing.jsonl", "hydra.run.dir=run"]
    assert train_in_process(monkeypatch, tmp_path, args) == 2
    assert one_line(capsys.readouterr().err).startswith("error: task.path='nothing.jsonl': no such file")
    assert not (tmp_path / "run").exists()


def test_every_scan_kind_takes_a_task_and_its_metric(finished_run, tmp_path, monkeypatch, capsys):
    """Every kind on a task, measured by the logit difference in zero mode with the structural export, then the mask
    scans again in patch mode: each table names its metric, and its figure is drawn."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    masks = tmp_path / "masks.yaml"
    masks.write_text("- [[0, 1], [1, 2]]\n")
    task = ["task=file", f"task.path={finished_run.parent / 'prompts.jsonl'}", "ablation.progress=false"]
    kinds = "baseline,single_head,layer,leave_one_in,pairs,custom,importance,pruning,l0_gates,head_scores,attribution"
    args = [f"run_dir={run}", *task, f"ablation=[{kinds}]", "ablation.metric=logit_diff"]
    args += [f"ablation.scans.custom.masks_file={masks}", "ablation.scans.l0_gates.l0.steps=5"]
    args += ["ablation.prune.export=true", "ablation.prune.fraction=0.25"]
    assert ablate_in_process(monkeypatch, tmp_path, args) == 0, capsys.readouterr().err
    folder = RunPaths(run).ablation / "tasks" / "prompts"
    for kind in kinds.split(","):
        table = pd.read_csv(folder / (f"{kind}.csv" if kind == "head_scores" else f"{kind}.zero.logit_diff.csv"))
        assert kind == "head_scores" or set(table["metric"]) == {"logit_diff"}, kind
    assert "logit_diff" in pd.read_csv(folder / "pruning.zero.logit_diff.csv")
    assert "logit_diff" in pd.read_csv(folder / "l0_gates.zero.logit_diff.csv")
    assert (folder / "pruned.zero.logit_diff.ckpt").exists()
    summary = json.loads((folder / "summary.json").read_text())["modes"]["zero.logit_diff"]
    assert summary["pruned"]["metric"] == "logit_diff" and "logit_diff_pruned" in summary["pruned"]
    assert set(summary["prunable_fraction"]) == {"gradient", "gradient_iterative", "single_head", "random"}
    patch = [f"run_dir={run}", *task, "ablation=[single_head,layer,pairs]", "ablation.mode=patch"]
    assert ablate_in_process(monkeypatch, tmp_path, patch) == 0
    all_positions = (folder / "single_head.patch.logit_diff.csv").read_bytes()
    assert ablate_in_process(monkeypatch, tmp_path, [*patch, "ablation.patch_positions=each"]) == 0
    by_position = pd.read_csv(folder / "single_head.patch.logit_diff.each.csv")
    assert set(by_position["position"]) == {"end"} and len(by_position) == 8  # id prompts name only their end
    assert (folder / "single_head.patch.logit_diff.csv").read_bytes() == all_positions  # not overwritten (issue 29)


def test_noise_and_denoise_write_their_own_tables(finished_run, tmp_path, monkeypatch):
    """Both wrote single_head.patch.logit_diff.csv: the first result was gone. Denoising has its own address, and
    its table says its direction."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    task = ["task=file", f"task.path={finished_run.parent / 'prompts.jsonl'}", "ablation.progress=false"]
    args = [f"run_dir={run}", *task, "ablation=single_head", "ablation.mode=patch"]
    assert ablate_in_process(monkeypatch, tmp_path, args) == 0
    assert ablate_in_process(monkeypatch, tmp_path, [*args, "ablation.patch_direction=denoise"]) == 0
    folder = RunPaths(run).ablation / "tasks" / "prompts"
    noise = pd.read_csv(folder / "single_head.patch.logit_diff.csv")
    denoise = pd.read_csv(folder / "single_head.patch.logit_diff.denoise.csv")
    assert set(noise["patch_direction"]) == {"noise"} and set(denoise["patch_direction"]) == {"denoise"}
    assert not noise["logit_diff"].equals(denoise["logit_diff"])
    sections = json.loads((folder / "summary.json").read_text())["modes"]
    assert {"patch.logit_diff", "patch.logit_diff.denoise"} <= set(sections)


def test_direct_effect_labels_what_it_read(finished_run, tmp_path, monkeypatch):
    """direct_effect reads the clean run's direct logits whatever the mode and metric: with metric=top1 and
    mode=patch its table said top1 and patch. It says the logit it read and that the run was clean."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    task = ["task=file", f"task.path={finished_run.parent / 'prompts.jsonl'}", "ablation.progress=false"]
    args = [f"run_dir={run}", *task, "ablation=direct_effect", "ablation.mode=patch", "ablation.metric=top1"]
    assert ablate_in_process(monkeypatch, tmp_path, args) == 0
    table = pd.read_csv(RunPaths(run).ablation / "tasks" / "prompts" / "direct_effect.patch.top1.csv")
    assert set(table["metric"]) == {"answer_logit"} and set(table["mode"]) == {"clean"}


def test_two_prompt_files_of_one_stem_do_not_share_a_results_folder(finished_run, tmp_path, monkeypatch, capsys):
    """other/prompts.jsonl wrote into tasks/prompts/ over the first file's results. It is refused, naming the file
    the folder holds, and task.name gives it a folder of its own."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    other = tmp_path / "other" / "prompts.jsonl"
    other.parent.mkdir()
    write_rows(other, [{"prompt": [0, 2, 3, 4, 2], "answer": 3, "wrong": 4, "corrupted": [0, 2, 6, 4, 2]}])
    args = [f"run_dir={run}", "ablation=single_head", "ablation.progress=false", "task=file"]
    assert ablate_in_process(monkeypatch, tmp_path, [*args, f"task.path={finished_run.parent / 'prompts.jsonl'}"]) == 0
    folder = RunPaths(run).ablation / "tasks" / "prompts"
    before = files_in(folder)
    capsys.readouterr()
    assert ablate_in_process(monkeypatch, tmp_path, [*args, f"task.path={other}"]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"error: task.path='{other}': its results folder ablation/tasks/prompts/ holds the"), line
    assert files_in(folder) == before
    assert ablate_in_process(monkeypatch, tmp_path, [*args, f"task.path={other}", "task.name=other"]) == 0
    assert (RunPaths(run).ablation / "tasks" / "other" / "single_head.zero.logit_diff.csv").exists()


def test_a_task_folder_that_recorded_no_source_is_adopted_only_for_its_own_prompts(
    finished_run, tmp_path, monkeypatch, capsys
):
    """Task folders written before they recorded their source: a rerun on the same prompts records the source and
    reads its results back; another file's prompts of the same stem, whose results would replace them, are refused."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    other = tmp_path / "other" / "prompts.jsonl"
    other.parent.mkdir()
    write_rows(other, [{"prompt": [0, 2, 3, 4, 2], "answer": 3, "wrong": 4, "corrupted": [0, 2, 6, 4, 2]}])
    args = [f"run_dir={run}", "ablation=single_head", "ablation.progress=false", "task=file"]
    own = f"task.path={finished_run.parent / 'prompts.jsonl'}"
    assert ablate_in_process(monkeypatch, tmp_path, [*args, own]) == 0
    summary_path = RunPaths(run).ablation / "tasks" / "prompts" / "summary.json"
    recorded = json.loads(summary_path.read_text())

    def as_written_before_sources():
        summary_path.write_text(json.dumps({k: v for k, v in recorded.items() if k != "task_source"}))

    as_written_before_sources()
    capsys.readouterr()
    assert ablate_in_process(monkeypatch, tmp_path, [*args, own]) == 0
    err = capsys.readouterr().err
    assert "ablation/tasks/prompts/ recorded no source" in err and "up to date" in err, err
    assert json.loads(summary_path.read_text())["task_source"] == recorded["task_source"]

    as_written_before_sources()
    before = files_in(summary_path.parent)
    assert ablate_in_process(monkeypatch, tmp_path, [*args, f"task.path={other}"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "ablation/tasks/prompts/ holds results of other prompts, written before task folders recorded" in line
    assert files_in(summary_path.parent) == before


def files_in(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_scan_table_with_a_nan_metric_is_refused_before_it_is_written(tmp_path):
    """A NaN in a metric column (a model that overflows, a metric's log of 0) was written to the CSV, the figure and
    the summary, then every read of it failed. The scan refuses it, naming the metric, the mask and the column."""
    session = SimpleNamespace(metric=METRICS["logit_diff"](), section="zero", address=ResultAddress(tmp_path))
    scan = KINDS["single_head"]("single_head", KINDS["single_head"].Settings(kind="single_head"), session)
    table = pd.DataFrame({"mask": ["L0H0", "L0H1"], "logit_diff": [1.0, 2.0], "delta_logit_diff": [0.5, float("inf")]})
    with pytest.raises(ConfigError) as error:
        scan.refuse_non_finite(table)
    assert str(error.value).startswith("ablation.metric='logit_diff': is inf for L0H1 in single_head's delta_logit")
    scan.refuse_non_finite(table.iloc[:1])


# --- what a prompts file can hold that used to be misread or fail with a traceback (issue 29) ----------------------


def build_file(path: Path, tokenizer=None, **cfg) -> object:
    return build_task(TaskConfig(source="file", path=str(path), **cfg), tokenizer or ByteTokens(), 64)


SHARED_FIRST_TOKEN = [
    # " Mary" and " John" on a byte-level model: both start with the space byte, and scored at their first token
    # their logit difference was 0 for every mask, silently
    (
        [
            {"prompt": "ab", "answer": "c", "wrong": "d"},
            {"prompt": "When Mary and John, John gave to", "answer": " Mary", "wrong": " John"},
        ],
        "prompt 1: the answer ' Mary' and the wrong answer ' John' both start with token 32 (' ')",
    ),
    ([{"prompt": "ab", "answer": "c", "wrong": "c"}], "prompt 0: the answer 'c' and the wrong answer 'c' both start"),
    ([{"prompt": [1, 2, 3], "answer": [4, 5], "wrong": [6, 5], "position": [0, -1]}], "prompt 0: the answer 5 and"),
    # two emoji on a byte-level model: both start with the byte 0xF0
    (
        [{"prompt": "ab", "answer": "🙂", "wrong": "🙃"}],
        "prompt 0: the answer '🙂' and the wrong answer '🙃' both start with token 240",
    ),
]


@pytest.mark.parametrize("rows, message", SHARED_FIRST_TOKEN)
def test_an_answer_and_wrong_answer_sharing_their_first_token_are_refused(tmp_path, rows, message):
    path = write_rows(tmp_path / "p.jsonl", rows)
    with pytest.raises(ConfigError) as error:
        build_file(path, IdsOnly(9, "x") if isinstance(rows[0]["prompt"], list) else None)
    assert str(error.value).startswith(f"task.path='{path}': {message}"), str(error.value)
    assert "end the prompt with the text they share" in str(error.value)


def test_answers_without_the_leading_space_the_tokenizer_gives_words_are_noted_once(tmp_path, capsys):
    """ "Paris" after "The capital of France is", on a tokenizer where " Paris" is another token, is scored as the
    token "Paris": a different answer than meant. Said once, with how many answers lack the space."""
    rows = [{"prompt": "When Mary and John", "answer": name} for name in ("5", " 5", "7", " Mary")]
    rows.append({"prompt": "When Mary and John ", "answer": "7"})  # the prompt ends with the space: right as it is
    tokenizer = gpt2_like_tokens()
    task = build_file(write_rows(tmp_path / "p.jsonl", rows), tokenizer)
    assert task.answer_ids[0, int(task.lengths[0]) - 1] == tokenizer.encode("5")[0][0]  # scored as written
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("note: task.path="), err
    assert "2 of 4 answers have no leading space (e.g. '5')" in err and "' 5' another token" in err, err
    # a byte-level tokenizer splits the space off: a bare answer continues the text, and nothing is said
    build_file(write_rows(tmp_path / "b.jsonl", TEXT_ROWS))
    assert capsys.readouterr().err == ""


def test_csv_cells_are_text_unless_the_task_says_token_ids(tmp_path):
    """A CSV's `7` was read as token id 7 (its column inferred as integers), not the text "7"."""
    path = tmp_path / "p.csv"
    path.write_text("prompt,answer,wrong\nab,7,8\n")
    task = build_file(path)
    assert task.answer_ids[task.score_mask].tolist() == [ord("7")]
    assert task.wrong_ids[task.score_mask].tolist() == [ord("8")]
    path.write_text("prompt,answer,wrong,position\n0 5 9 4,9,7,1\n")
    task = build_file(path, IdsOnly(16, "x"), csv_ids=True)
    assert task.input_ids[0].tolist() == [0, 5, 9, 4] and task.score_mask[0].nonzero().flatten().tolist() == [1]
    assert task.answer_ids[0, 1] == 9 and task.wrong_ids[0, 1] == 7


BAD_CSV = [
    # an unquoted comma in a prompt shifted the fields silently: "ab" became the index, " cd" the prompt
    ("prompt,answer,wrong\nab, cd,e,f\n", "row 0 (line 2) has 4 fields, the header 3 (prompt, answer, wrong)"),
    # a row with more fields than the header was blamed on the next row
    ("prompt,answer\nab,c\nab,c,d\nab,c\n", "row 1 (line 3) has 3 fields, the header 2"),
    ("prompt,answer\nab\n", "row 0 (line 2) has 1 fields, the header 2"),
]


@pytest.mark.parametrize("text, message", BAD_CSV)
def test_a_csv_row_with_other_fields_than_its_header_is_refused_naming_the_row(tmp_path, text, message):
    path = tmp_path / "p.csv"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        build_file(path)
    assert str(error.value).startswith(f"task.path='{path}': {message}"), str(error.value)
    assert "quote a field that holds a comma" in str(error.value)


def test_csv_ids_that_are_not_integers_are_refused_naming_the_row(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("prompt,answer\n0 1 2,3\n0 1 x,3\n")
    with pytest.raises(ConfigError, match=r"^task.prompt_field='prompt': .*row 1: '0 1 x' is not token ids"):
        build_file(path, IdsOnly(16, "x"), csv_ids=True)


ONE_LINE_FILES = [
    # position "-1" as a string: TypeError '<' not supported between instances of 'str' and 'int'
    (
        '{"prompt": "ab", "answer": "c", "position": "-1"}\n',
        ".jsonl",
        "task.position_field='position': ",
        "row 0: '-1' is not a token index (an integer, or a list of them)",
    ),
    # column-wise JSON (pandas' to_json()): one row whose fields hold columns, misread as token ids or a traceback
    (
        '{"prompt": {"0": "ab", "1": "cd"}, "answer": {"0": "c", "1": "e"}}',
        ".json",
        "task.path=",
        "holds its fields as columns",
    ),
    (
        '{"prompt": ["ab", "cd"], "answer": ["c", "e"], "position": [-1, -1]}',
        ".json",
        "task.path=",
        "holds its fields as columns",
    ),
    # NaN in one answer turned the column into floats: "the answer 54.0 is not in the model's vocabulary"
    (
        '{"prompt": [1, 2], "answer": 54}\n{"prompt": [1, 2], "answer": NaN}\n',
        ".jsonl",
        "task.answer_field='answer': ",
        "row 1 has no value for this field",
    ),
    ('{"prompt": [1, 2], "answer": 2.5}\n', ".jsonl", "task.answer_field='answer': ", "row 0: 2.5 is not "),
    # a byte that is not UTF-8 in a field the task reads (in one it does not read, it is not read at all)
    (b'{"prompt": "a\xffb", "answer": "c"}\n', ".jsonl", "task.prompt_field='prompt': ", "row 0 is not UTF-8 text"),
]


@pytest.mark.parametrize("content, suffix, key, message", ONE_LINE_FILES)
def test_a_field_of_the_wrong_kind_is_one_config_error_naming_the_row(tmp_path, capfd, content, suffix, key, message):
    path = tmp_path / f"p{suffix}"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError) as error:
        build_file(path, IdsOnly(64, "x") if "[1, 2]" in str(content) else None)
    assert str(error.value).startswith(key) and message in str(error.value), str(error.value)
    assert capfd.readouterr().err == ""


def test_a_byte_that_is_not_utf8_in_a_field_the_task_does_not_read_is_ignored(tmp_path):
    """It failed with a UnicodeDecodeError traceback: every field of a row was decoded."""
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"prompt": "ab", "answer": "c", "note": "\xff"}\n')
    assert build_file(path).answer_ids[0, 1] == ord("c")


def test_a_text_prompt_for_a_model_of_token_ids_names_the_file_and_the_prompt(tmp_path):
    path = write_rows(tmp_path / "p.jsonl", [{"prompt": [1, 2], "answer": 3}, {"prompt": "ab", "answer": 3}])
    with pytest.raises(ConfigError) as error:
        build_file(path, IdsOnly(64, "the model reads its synthetic alphabet"))
    assert str(error.value) == (
        f"task.path='{path}': prompt 1: the prompt 'ab' is text, but the model reads its synthetic alphabet: "
        "give prompts and answers as token ids"
    )


@pytest.mark.parametrize("content", [b"{not json\n", b"garbage"])
def test_a_file_that_does_not_parse_is_one_line_without_the_readers_log(tmp_path, content):
    """datasets logged its own ERROR line ("Failed to load JSON from file ...") before ours."""
    import datasets

    logged: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = logged.append
    datasets.logging.get_logger("datasets").addHandler(handler)
    try:
        for suffix in (".jsonl", ".parquet"):
            path = tmp_path / f"p{suffix}"
            path.write_bytes(content)
            with pytest.raises(ConfigError, match=f"does not read as {suffix}"):
                build_file(path)
    finally:
        datasets.logging.get_logger("datasets").removeHandler(handler)
    assert [record.getMessage() for record in logged] == []


def test_a_folder_named_like_a_prompts_file_is_said_to_be_a_folder(tmp_path):
    (tmp_path / "x.jsonl").mkdir()
    with pytest.raises(ConfigError, match=r"^task.path='.*x.jsonl': is a folder, not a file$"):
        build_file(tmp_path / "x.jsonl")

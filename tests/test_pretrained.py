"""Converting transformers models exactly: every family gives the same logits as transformers (float32 1e-5, float64
1e-10), a zero-ablated head equals transformers with that head's slice of the output projection's input zeroed, the
converted model is an ordinary headcount model, and every way loading can fail is one line naming model.pretrained."""

import sys

import pytest
import torch

pytest.importorskip("transformers")

import transformers as tf  # noqa: E402
from pretrained_helpers import CASES, converted, hf_model, out_projection, tokens  # noqa: E402

from headcount.errors import ConfigError  # noqa: E402
from headcount.model.intervention import gated, reads
from headcount.pretrained import SUPPORTED, convert, hf_model_config, load_pretrained, pretrained_config  # noqa: E402

TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


@pytest.fixture
def rmsnorm_keeps_float64(monkeypatch):
    """transformers' RMSNorm computes in float32 even for float64 inputs, a float32 bottleneck in an otherwise
    float64 model; headcount's computes in at least float32. For the float64 comparison, theirs keeps the dtype."""

    def forward(self, x):
        x32 = x.to(torch.promote_types(x.dtype, torch.float32))
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)).to(x.dtype)

    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    for norm in (LlamaRMSNorm, Qwen2RMSNorm):
        monkeypatch.setattr(norm, "forward", forward)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", list(CASES))
def test_converted_model_gives_transformers_logits(case, dtype, rmsnorm_keeps_float64):
    hf, model = converted(case, dtype)
    with torch.no_grad():
        expected = hf(tokens()).logits
        got = model(tokens())
    assert got.dtype == dtype and not model.training
    torch.testing.assert_close(got, expected, rtol=0, atol=TOL[dtype])
    with torch.no_grad():  # the reference path (which returns attention patterns) agrees too
        patterned = model(tokens(), reads(["attn.pattern"], range(model.n_layers)))
        torch.testing.assert_close(patterned, expected, rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("case", list(CASES))
def test_converted_config_describes_the_family(case):
    hf, model = converted(case)
    cfg, hf_cfg = model.cfg, hf.config
    assert cfg.n_layers == 2 and cfg.attn.n_heads == 4 and cfg.tie_embeddings == hf_cfg.tie_word_embeddings
    assert model.num_params() == sum(p.numel() for p in hf.parameters())
    if hf_cfg.model_type in ("llama", "qwen2"):
        assert (cfg.positions, cfg.norm, cfg.mlp_act) == ("rotary", "rmsnorm", "swiglu")
        assert cfg.attn.n_kv_heads == hf_cfg.num_key_value_heads
        assert model.blocks[0].attn.W_K.shape == (hf_cfg.num_key_value_heads, 32, model.head_dim)
    if hf_cfg.model_type == "gpt_neox":
        assert cfg.parallel_residual == hf_cfg.use_parallel_residual and cfg.rotary_fraction < 1
    if hf_cfg.model_type == "gpt2":
        assert cfg.positions == "learned" and cfg.mlp_act == hf_cfg.activation_function.replace("gelu_new", "gelu_tanh")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", list(CASES))
def test_zero_ablated_head_equals_its_slice_of_the_output_projection_zeroed(case, dtype, rmsnorm_keeps_float64):
    hf, model = converted(case, dtype)
    layer, head, D = 1, 2, model.head_dim

    def zero_head(module, args):
        z = args[0].clone()
        z[..., head * D : (head + 1) * D] = 0
        return (z,)

    gates = torch.ones(2, 4, dtype=dtype)
    gates[layer, head] = 0
    handle = out_projection(hf, layer).register_forward_pre_hook(zero_head)
    try:
        with torch.no_grad():
            expected = hf(tokens()).logits
    finally:
        handle.remove()
    with torch.no_grad():
        ablated = model(tokens(), gated(gates))
        assert not torch.allclose(ablated, model(tokens()), atol=1e-3)  # the head matters
    torch.testing.assert_close(ablated, expected, rtol=0, atol=TOL[dtype])


def test_conversion_leaves_the_random_stream_and_the_source_alone():
    hf = hf_model("llama_gqa_untied")
    before = {name: p.clone() for name, p in hf.state_dict().items()}
    state = torch.get_rng_state()
    model = convert(hf)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(p, before[name]) for name, p in hf.state_dict().items())
    with torch.no_grad():  # the converted model owns its weights
        model.blocks[0].attn.qkv.weight.zero_()
    assert all(torch.equal(p, before[name]) for name, p in hf.state_dict().items())


def test_a_weight_the_conversion_does_not_know_is_an_error():
    hf = hf_model("gpt2_tied")
    hf.transformer.h[0].attn.extra = torch.nn.Linear(2, 2)  # a weight no family module moves
    with pytest.raises(ValueError, match="left 2 weights unused: transformer.h.0.attn.extra.bias"):
        convert(hf)


# What headcount's model cannot reproduce is refused by name, before any weight is read.


def test_unknown_architecture_names_the_supported_ones():
    with pytest.raises(ConfigError, match="model.pretrained=.*architecture 'gptj' is not supported.*gpt2") as err:
        hf_model_config(tf.GPTJConfig(n_layer=1, n_embd=32, n_head=4), "tiny-gptj")
    assert "\n" not in str(err.value) and all(name in str(err.value) for name in SUPPORTED)


@pytest.mark.parametrize(
    "hf_config, words",
    [
        (lambda: tf.LlamaConfig(**CASES_KW(), hidden_act="gelu"), "hidden_act='gelu'"),
        (lambda: tf.GPT2Config(n_layer=1, n_embd=32, n_head=4, scale_attn_by_inverse_layer_idx=True), "inverse"),
        (lambda: tf.GPT2Config(n_layer=1, n_embd=32, n_head=4, activation_function="relu"), "relu"),
    ],
    ids=["llama_gelu", "gpt2_layer_scaling", "gpt2_relu"],
)
def test_unsupported_features_are_refused_naming_the_model_type(hf_config, words):
    cfg = hf_config()
    with pytest.raises(ConfigError, match=f"model.pretrained='tiny': {cfg.model_type} .*{words}") as err:
        hf_model_config(cfg, "tiny")
    assert "\n" not in str(err.value)


def CASES_KW() -> dict:
    return {"hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 4}


# Loading from a source: a save_pretrained folder round trip, and every way a source can be wrong.


def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(49)} | {"[UNK]": 49}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tf.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]")


def test_load_pretrained_reads_a_saved_folder_with_its_tokenizer(tmp_path):
    hf = hf_model("neox_parallel")
    hf.save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    model, tokenizer, provenance = load_pretrained(str(tmp_path), dtype=torch.float64)
    ids = tokenizer("w3 w7 w1 w3 w7", return_tensors="pt").input_ids
    assert ids.tolist() == [[3, 7, 1, 3, 7]]
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf.double()(ids).logits, rtol=0, atol=1e-10)
    assert model.cfg.parallel_residual and next(model.parameters()).dtype == torch.float64
    assert pretrained_config(str(tmp_path)) == model.cfg
    assert (provenance["kind"], provenance["model_type"], provenance["dtype"]) == ("folder", "gpt_neox", "float64")
    assert set(provenance["files"]) == {"config.json", "model.safetensors"}
    assert all(len(digest) == 64 for digest in provenance["files"].values())


def test_a_folder_without_a_tokenizer_says_so(tmp_path):
    hf_model("gpt2_tied").save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="model.pretrained=.*has no tokenizer") as err:
        load_pretrained(str(tmp_path))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("left", [[], ["tokenizer_config.json"]], ids=["no tokenizer file", "its config alone"])
def test_a_folder_without_tokenizer_files_names_the_folder_and_the_files_to_add(left, tmp_path):
    """transformers' reason runs over several lines; its first, all the line said, ended "... from one of: " and
    named nothing."""
    from checkpoint_files import folder_checkpoint

    folder = folder_checkpoint(tmp_path / "model")
    for file in ["tokenizer.json", "tokenizer_config.json"]:
        if file not in left:
            (folder / file).unlink()
    with pytest.raises(ConfigError) as err:
        load_pretrained(str(folder))
    assert str(err.value) == (
        f"model.pretrained='{folder}': has no tokenizer transformers can load: {folder} holds none of the files its "
        "tokenizer (TokenizersBackend) is read from (tokenizer.json, tokenizer.model); copy them from where the "
        "checkpoint came from, or write them there with the tokenizer's save_pretrained"
    )


def test_a_folder_whose_tokenizer_file_does_not_read_names_it_in_one_line(tmp_path):
    from checkpoint_files import folder_checkpoint

    folder = folder_checkpoint(tmp_path / "model")
    (folder / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError) as err:
        load_pretrained(str(folder))
    message = str(err.value)
    assert message.startswith(
        f"model.pretrained='{folder}': has no tokenizer transformers can load: its tokenizer files in {folder} "
        "(tokenizer.json) do not read: "
    )
    assert "\n" not in message and not message.rstrip().endswith(":")


@pytest.mark.parametrize(
    "source, words",
    [
        ("./no/such/folder", "no such folder or .gguf file"),
        ("missing.gguf", "no such .gguf file"),
        ("headcount-tests/no-such-model", r"no network \(or HF_HUB_OFFLINE set\)"),
    ],
)
def test_bad_sources_are_one_line_naming_the_key(source, words, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty cache: nothing to find offline
    with pytest.raises(ConfigError, match=f"model.pretrained='{source}'.*{words}") as err:
        load_pretrained(source)
    assert "\n" not in str(err.value)


def test_a_folder_without_config_says_what_it_needs(tmp_path):
    with pytest.raises(ConfigError, match="model.pretrained=.*config.json"):
        load_pretrained(str(tmp_path))


@pytest.mark.parametrize(
    "package, source",
    [("transformers", "folder"), ("gguf", "model.gguf"), ("accelerate", "folder"), ("accelerate", "model.gguf")],
)
def test_a_missing_package_names_the_extra(package, source, monkeypatch, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.gguf").write_bytes(b"")
    monkeypatch.setitem(sys.modules, package, None)  # import fails as if it were not installed
    extra = r"pip install 'headcount\[pretrained\]'"
    with pytest.raises(ConfigError, match=f"needs the optional package {package}: {extra}"):
        load_pretrained(str(tmp_path / source) if source != "folder" else str(tmp_path))


# A converted model is an ordinary headcount model: every stage downstream runs on it unchanged.


def test_converted_grouped_model_runs_through_every_ablation_stage(tmp_path):
    from headcount.ablation.engine.evaluator import MaskEvaluator
    from headcount.ablation.engine.masks import masks_to_gates, single_head_masks
    from headcount.ablation.methods.importance import gradient_importance
    from headcount.ablation.methods.l0_gates import train_l0_gates
    from headcount.ablation.methods.structural import save_pruned_checkpoint
    from headcount.ablation.scans.head_scores import head_pattern_scores
    from headcount.config.ablation import L0GatesConfig
    from headcount.metrics import masked_loss_and_accuracy
    from headcount.run_dir import load_model

    _, model = converted("llama_gqa_untied", torch.float64)
    batches = [{"input_ids": tokens(4, seed), "loss_mask": torch.ones(4, 12, dtype=torch.bool)} for seed in (1, 2)]
    gates_MLH = masks_to_gates(single_head_masks(model.heads_per_layer), model.heads_per_layer, torch.float64)
    fast = MaskEvaluator(model, batches, masks_per_pass=3).evaluate(gates_MLH)
    for m, gates_LH in enumerate(gates_MLH):  # one forward pass per mask (both batches hold 4 x 11 targets)
        losses = [masked_loss_and_accuracy(model(b["input_ids"], gated(gates_LH)), **b_args(b))[0] for b in batches]
        torch.testing.assert_close(fast["loss"][m], torch.stack(losses).mean(), rtol=0, atol=1e-10)
    importance_LH = gradient_importance(model, batches)
    assert importance_LH.shape == (2, 4) and bool((importance_LH > 0).all())
    scores = head_pattern_scores(model, batches)
    assert len(scores) == 8 and scores["prev_token_score"].between(0, 1).all()
    l0 = train_l0_gates(model, batches, L0GatesConfig(steps=3), target_heads=None, progress=False)
    assert l0.gate_LH.shape == (2, 4)
    _, model32 = converted("llama_gqa_untied")  # checkpoints load in float32
    save_pruned_checkpoint(model32, tmp_path / "converted.ckpt", {"source": "tiny llama"})
    assert torch.equal(load_model(tmp_path / "converted.ckpt").eval()(tokens()), model32(tokens()))


def b_args(batch: dict) -> dict:
    return {"input_ids_BT": batch["input_ids"], "loss_mask_BT": batch["loss_mask"]}


def test_a_hub_name_without_a_network_is_one_line(monkeypatch):
    """Online mode with no network: transformers' OSError (several lines) becomes its first line."""
    from huggingface_hub import constants

    from headcount.pretrained.source import hub_errors, locate

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    message = "We couldn't connect to 'https://huggingface.co' to load the files.\nCheck your internet connection."
    expected = "org/model.*the Hub cannot provide it: We couldn't connect"
    with pytest.raises(ConfigError, match=expected) as err, hub_errors(locate("org/model")):
        raise OSError(message)
    assert "\n" not in str(err.value)

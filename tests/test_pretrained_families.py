"""Every family beyond GPT-2, Llama 1/2, Qwen2 and GPT-NeoX (test_pretrained.py), converted exactly: a tiny random
transformers model with its features switched on (tests/family_cases.py), saved as a folder and loaded by headcount,
gives transformers' eager logits in float32 and float64, every head's zero ablation equals transformers with that
head's slice of o_proj's input zeroed, and switching any of the family's features off in the converted config makes
the logits differ."""

import copy

import pytest
import torch

pytest.importorskip("transformers")

import transformers as tf  # noqa: E402
from family_cases import CASES, FEATURES, attention_layers, hf_model, tokens  # noqa: E402

from headcount.config.model import RopeScalingConfig  # noqa: E402
from headcount.errors import ConfigError  # noqa: E402
from headcount.model.intervention import gated, reads
from headcount.model.transformer import Transformer  # noqa: E402
from headcount.pretrained import hf_model_config, load_pretrained  # noqa: E402

# float32: both sides round differently (fused SDPA vs eager softmax, op order); float64: transformers' float32 casts
# (eager softmax, RMSNorm) are lifted by the fixture below, leaving float64 rounding.
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


@pytest.fixture
def transformers_keeps_float64(monkeypatch):
    """transformers' eager attention takes its softmax in float32 and its RMSNorms normalise in float32, even for
    float64 inputs: float32 bottlenecks in an otherwise float64 model. For the float64 comparison they keep float64
    (float32 inputs are computed by transformers' own code, unchanged)."""
    softmax = torch.nn.functional.softmax

    def softmax_keeping_float64(x, *args, dtype=None, **kwargs):
        return softmax(x, *args, dtype=None if x.dtype == torch.float64 else dtype, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "softmax", softmax_keeping_float64)
    modules = [tf.models.gemma, tf.models.gemma2, tf.models.gemma3, tf.models.llama, tf.models.mistral]
    modules += [tf.models.qwen2, tf.models.qwen3, tf.models.olmo2, tf.models.phi3]
    for module in modules:
        modeling = getattr(module, f"modeling_{module.__name__.rsplit('.', 1)[1]}")
        for name in dir(modeling):
            if name.endswith("RMSNorm") and isinstance(getattr(modeling, name), type):
                cls = getattr(modeling, name)
                monkeypatch.setattr(cls, "forward", float64_rmsnorm(cls.forward, name.startswith("Gemma")))


def float64_rmsnorm(forward, plus_one: bool):
    def patched(self, x):
        if x.dtype != torch.float64:
            return forward(self, x)
        eps = getattr(self, "variance_epsilon", getattr(self, "eps", None))
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return normed * (1.0 + self.weight) if plus_one else self.weight * normed

    return patched


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """case -> a save_pretrained folder of its tiny random model, with a tokenizer; written on first use."""
    made = {}

    def folder(case):
        if case not in made:
            from test_pretrained import tiny_tokenizer

            made[case] = tmp_path_factory.mktemp(case)
            hf_model(case).save_pretrained(made[case])
            tiny_tokenizer().save_pretrained(made[case])
        return made[case]

    return folder


def both(folders, case: str, dtype: torch.dtype):
    """(transformers' model, headcount's) loaded from the case's folder in dtype."""
    folder = folders(case)
    hf = tf.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager").eval()
    model, _, provenance = load_pretrained(str(folder), dtype=dtype)
    assert provenance["model_type"] == hf.config.model_type
    return hf, model


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", list(CASES))
def test_family_gives_transformers_logits_and_head_ablations(case, dtype, folders, transformers_keeps_float64):
    hf, model = both(folders, case, dtype)
    x = tokens()
    with torch.no_grad():
        expected = hf(x).logits
        torch.testing.assert_close(model(x), expected, rtol=0, atol=TOL[dtype])
        patterned = model(x, reads(["attn.pattern"], range(model.n_layers)))  # the explicit attention path
        torch.testing.assert_close(patterned, expected, rtol=0, atol=TOL[dtype])
    D, L, H = model.head_dim, model.n_layers, model.max_heads
    for layer in range(L):
        for head in range(H):
            gates = torch.ones(L, H, dtype=dtype)
            gates[layer, head] = 0
            with torch.no_grad(), zeroed_head(attention_layers(hf)[layer].self_attn.o_proj, head, D):
                ablated_expected = hf(x).logits
            with torch.no_grad():
                torch.testing.assert_close(model(x, gated(gates)), ablated_expected, rtol=0, atol=TOL[dtype])


class zeroed_head:
    """An o_proj forward pre-hook zeroing one head's slice of its input, for the duration of a with block."""

    def __init__(self, o_proj: torch.nn.Module, head: int, D: int):
        self.o_proj, self.head, self.D = o_proj, head, D

    def hook(self, module, args):
        z = args[0].clone()
        z[..., self.head * self.D : (self.head + 1) * self.D] = 0
        return (z,)

    def __enter__(self):
        self.handle = self.o_proj.register_forward_pre_hook(self.hook)

    def __exit__(self, *exc):
        self.handle.remove()


@pytest.mark.parametrize("case, key", [(case, key) for case, keys in FEATURES.items() for key in keys])
def test_switching_a_feature_off_breaks_the_agreement(case, key, folders):
    hf, model = both(folders, case, torch.float32)
    cfg = copy.deepcopy(model.cfg)
    *path, last = key.split(".")
    target = cfg
    for part in path:
        target = getattr(target, part)
    setattr(target, last, FEATURES[case][key])
    if key == "sliding_window":  # a window as long as the context: the layers keep their types (and local base)
        cfg.sliding_window = cfg.n_ctx
    if key == "rope_scaling.type":  # the scaling's own keys go with it (the config refuses them unused)
        cfg.rope_scaling = RopeScalingConfig()
    with torch.random.fork_rng(devices=[]):
        broken = Transformer(cfg).eval()
    broken.load_state_dict(model.state_dict(), strict=False)  # a switched-off q/k or post norm has no weights
    with torch.no_grad():
        gap = (broken(tokens()) - hf(tokens()).logits).abs().max().item()
    assert gap > 1e-3, f"{case}: switching {key} off changes the logits by only {gap:.1e}"


def test_the_converted_config_names_each_family_feature():
    gemma3 = hf_model_config(CASES["gemma3"](), "tiny")
    assert (gemma3.norm, gemma3.mlp_act, gemma3.qk_norm) == ("rmsnorm_plus_one", "geglu_tanh", "head")
    assert gemma3.embed_scale and gemma3.pre_norm and gemma3.post_norm and gemma3.tie_embeddings
    assert (gemma3.sliding_window, gemma3.layer_types) == (5, ["sliding", "full", "sliding"])
    assert (gemma3.rotary_theta, gemma3.rotary_theta_local, gemma3.rope_scaling.type) == (1000.0, 50.0, "linear")
    gemma2 = hf_model_config(CASES["gemma2"](), "tiny")
    assert (gemma2.attn.softcap, gemma2.final_softcap, gemma2.attn.query_pre_attn_scalar) == (1.5, 2.0, 20.0)
    mistral, olmo2 = hf_model_config(CASES["mistral"](), "tiny"), hf_model_config(CASES["olmo2"](), "tiny")
    assert (mistral.sliding_window, mistral.layer_types) == (5, None)
    assert (olmo2.pre_norm, olmo2.post_norm, olmo2.qk_norm) == (False, True, "projection")
    dynamic = hf_model_config(CASES["llama_dynamic"](), "tiny")
    assert (dynamic.n_ctx, dynamic.rope_scaling.original_n_ctx) == (16, 8)


@pytest.mark.parametrize(
    "hf_config, words",
    [
        (lambda: tf.Phi3Config(**small(), rope_parameters=longrope()), "rope_type='longrope'.*supported: default"),
        (lambda: tf.Gemma3TextConfig(**small(), use_bidirectional_attention=True), "bidirectional"),
        (lambda: tf.Gemma2Config(**small(), hidden_activation="relu"), "activation 'relu'"),
    ],
    ids=["phi3_longrope", "gemma3_bidirectional", "gemma2_relu"],
)
def test_what_a_family_cannot_do_is_refused_by_name(hf_config, words):
    cfg = hf_config()
    with pytest.raises(ConfigError, match=f"model.pretrained='tiny': {cfg.model_type} .*{words}") as err:
        hf_model_config(cfg, "tiny")
    assert "\n" not in str(err.value)


def small() -> dict:
    return {"hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 4}


def longrope() -> dict:
    factors = [1.0] * 4
    return {
        "rope_type": "longrope",
        "short_factor": factors,
        "long_factor": factors,
        "original_max_position_embeddings": 8,
    }


@pytest.mark.parametrize("case", ["gemma3", "gemma2", "olmo2"])
def test_the_evaluator_restarts_mid_block_exactly_on_a_converted_family(case, folders):
    """Prefix caching and finishing a layer from its cached z (post-norms after the heads combine, windows and
    soft-caps in every pass) give each mask's loss as a plain forward pass does."""
    from headcount.ablation.engine.evaluator import MaskEvaluator
    from headcount.ablation.engine.masks import masks_to_gates, single_head_masks
    from headcount.metrics import masked_loss_and_accuracy

    _, model = both(folders, case, torch.float64)
    batches = [{"input_ids": tokens(3, seed), "loss_mask": torch.ones(3, 16, dtype=torch.bool)} for seed in (1, 2)]
    gates_MLH = masks_to_gates(single_head_masks(model.heads_per_layer), model.heads_per_layer, torch.float64)
    fast = MaskEvaluator(model, batches, masks_per_pass=3).evaluate(gates_MLH)
    for m, gates_LH in enumerate(gates_MLH):
        losses = [
            masked_loss_and_accuracy(model(b["input_ids"], gated(gates_LH)), b["input_ids"], b["loss_mask"])[0]
            for b in batches
        ]
        torch.testing.assert_close(fast["loss"][m], torch.stack(losses).mean(), rtol=0, atol=1e-10)


GEMMA3_GGUF_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gemma3_gguf(path, hf: torch.nn.Module):
    """The tiny Gemma 3 as a float32 GGUF file the way llama.cpp writes one: norm weights stored as 1 + w, no q/k
    permutation, tied unembedding; a byte-level tokenizer of the first VOCAB bytes."""
    import gguf

    from headcount.pretrained.tiny_random import byte_characters

    c = hf.config
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_context_length(c.max_position_embeddings)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_sliding_window(c.sliding_window)
    writer.add_rope_freq_base(1000.0)
    writer.add_vocab_size(c.vocab_size)
    chars = byte_characters()
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([chars[b] for b in range(c.vocab_size)])
    writer.add_token_types([1] * c.vocab_size)
    writer.add_token_scores([0.0] * c.vocab_size)
    for name, tensor in hf.state_dict().items():
        module = name.removesuffix(".weight")
        if module == "lm_head":
            continue
        top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm"}
        if module in top:
            gguf_name = top[module]
        else:
            _, _, layer, rest = module.split(".", 3)
            gguf_name = f"blk.{layer}.{GEMMA3_GGUF_NAMES[rest]}"
        writer.add_tensor(f"{gguf_name}.weight", (tensor + 1 if "norm" in name else tensor).float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gemma3_gguf_file_converts_as_transformers_reads_it(tmp_path):
    """transformers reads a Gemma 3 .gguf as gemma3_text (rope_theta from the file, the rest of the config from its
    defaults: layer pattern, local base, query_pre_attn_scalar); headcount converts what it reads, exactly (float32:
    transformers' GGUF kernels compute in float32)."""
    pytest.importorskip("gguf")
    path = gemma3_gguf(tmp_path / "tiny-gemma3.gguf", hf_model("gemma3"))
    hf = tf.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, attn_implementation="eager").eval()
    model, _, provenance = load_pretrained(str(path))
    assert (provenance["kind"], provenance["model_type"]) == ("gguf", "gemma3_text")
    assert model.cfg.qk_norm == "head" and model.cfg.sliding_window == 5 and model.cfg.embed_scale
    with torch.no_grad():
        torch.testing.assert_close(model(tokens()), hf(tokens()).logits, rtol=0, atol=TOL[torch.float32])

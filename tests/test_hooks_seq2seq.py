"""docs/guide/interventions.md's encoder-decoder recipes (HookedSeq2Seq), each equal to transformers run with raw
PyTorch hooks on the same tiny random T5 (v1.1) and BART, in float32 and float64: zero one cross-attention head and
get the loss, patch an encoder head's z from a corrupted source, cache enc.out and a decoder layer's resid_pre, add a
steering vector to the decoder's stream (teacher-forced logits and greedy generation). In float64, transformers' T5
runs with its norm's variance in float64 (seq2seq_helpers.t5_norm_in_its_dtype)."""

import pytest
import torch

pytest.importorskip("transformers")

import transformers as tf  # noqa: E402
from seq2seq_helpers import converted, out_projection, t5_norm_in_its_dtype  # noqa: E402

import headcount  # noqa: E402
from headcount import HookedSeq2Seq  # noqa: E402
from headcount.errors import ConfigError  # noqa: E402
from headcount.model.intervention import add  # noqa: E402
from headcount.model.sites import parse_stack_site  # noqa: E402

CASES = ["t5_v1_1", "bart"]
DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
LAYER, HEAD = 1, 2


@pytest.fixture(autouse=True)
def t5_norm_variance_in_float64(monkeypatch):
    monkeypatch.setattr(tf.models.t5.modeling_t5.T5LayerNorm, "forward", t5_norm_in_its_dtype)


def hooked(case: str, dtype: torch.dtype) -> tuple[torch.nn.Module, HookedSeq2Seq]:
    hf, model = converted(case, dtype)
    config = hf.config
    return hf, HookedSeq2Seq(model, None, case, config.decoder_start_token_id, config.eos_token_id, config.pad_token_id)


def ids(batch: int = 2, length: int = 10, seed: int = 1) -> torch.Tensor:
    """Token ids without special tokens (3..39)."""
    return torch.randint(3, 40, (batch, length), generator=torch.Generator().manual_seed(seed))


def with_hooks(pre_hooks=(), hooks=()):
    """A context holding raw transformers forward pre-hooks and forward hooks, (module, fn) each."""

    class Held:
        def __enter__(self):
            self.handles = [m.register_forward_pre_hook(fn) for m, fn in pre_hooks]
            self.handles += [m.register_forward_hook(fn) for m, fn in hooks]

        def __exit__(self, *exc):
            for handle in self.handles:
                handle.remove()

    return Held()


def decoder_layers(hf) -> torch.nn.ModuleList:
    return hf.decoder.block if hf.config.model_type == "t5" else hf.model.decoder.layers


def head_width(hf, kind: str) -> int:
    return hf.config.d_kv if hf.config.model_type == "t5" else hf.config.d_model // hf.config.decoder_attention_heads


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_zero_one_cross_attention_head_and_get_the_loss(case, dtype):
    hf, model = hooked(case, dtype)
    src, tgt, D = ids(), ids(length=7, seed=2), head_width(hf, "cross")

    def zero_head(z, site):
        z[:, :, HEAD] = 0  # z: (B, T, H, D)

    with torch.no_grad():
        ours = model.loss(src, tgt, hooks=[(f"dec.blocks.{LAYER}.cross.z", zero_head)])
        plain = model.loss(src, tgt)

    def theirs_hook(module, args):
        z = args[0].clone()
        z[..., HEAD * D : (HEAD + 1) * D] = 0
        return (z,)

    with torch.no_grad(), with_hooks([(out_projection(hf, "cross", LAYER), theirs_hook)]):
        theirs = hf(input_ids=src, labels=tgt).loss
    torch.testing.assert_close(ours, theirs, rtol=0, atol=TOL[dtype])
    assert abs(float(ours) - float(plain)) > 1e-4  # the head matters
    torch.testing.assert_close(plain, hf(input_ids=src, labels=tgt).loss.detach(), rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_patch_an_encoder_head_from_a_corrupted_source(case, dtype):
    hf, model = hooked(case, dtype)
    clean, corrupted, D = ids(seed=1), ids(seed=3), head_width(hf, "enc")
    decoder_input = model.decoder_input(ids(length=7, seed=2))
    name = f"enc.blocks.{LAYER}.attn.z"
    with torch.no_grad():
        _, cache = model.run_with_cache(corrupted, decoder_input, names=[name])
        assert list(cache) == [name]

        def patch(z, site):
            z[:, :, HEAD] = cache[site.name][:, :, HEAD]  # site.name is the stack's: enc.blocks.1.attn.z

        ours = model.run_with_hooks(clean, decoder_input, hooks=[(name, patch)])
        plain = model(clean, decoder_input)

    kept = {}
    out_proj = out_projection(hf, "enc", LAYER)
    with torch.no_grad():
        with with_hooks([(out_proj, lambda module, args: kept.update(z=args[0].clone()))]):
            hf(input_ids=corrupted, decoder_input_ids=decoder_input)

        def theirs_patch(module, args):
            z = args[0].clone()
            z[..., HEAD * D : (HEAD + 1) * D] = kept["z"][..., HEAD * D : (HEAD + 1) * D]
            return (z,)

        with with_hooks([(out_proj, theirs_patch)]):
            theirs = hf(input_ids=clean, decoder_input_ids=decoder_input).logits
    torch.testing.assert_close(ours, theirs, rtol=0, atol=TOL[dtype])
    assert (ours - plain).abs().max() > 1e-4


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_cache_the_encoder_output_and_a_decoder_layers_resid_pre(case, dtype):
    hf, model = hooked(case, dtype)
    src, decoder_input = ids(), model.decoder_input(ids(length=7, seed=2))
    names = ["enc.out", f"dec.blocks.{LAYER}.resid_pre"]
    with torch.no_grad():
        logits, cache = model.run_with_cache(src, decoder_input, names=names)
    kept = {}
    encoder = hf.encoder if hf.config.model_type == "t5" else hf.model.encoder
    with (
        torch.no_grad(),
        with_hooks(
            [(decoder_layers(hf)[LAYER], lambda module, args: kept.update(resid=args[0]))],
            [(encoder, lambda module, args, out: kept.update(out=out.last_hidden_state))],
        ),
    ):
        theirs = hf(input_ids=src, decoder_input_ids=decoder_input).logits
    assert sorted(cache) == sorted(names)
    torch.testing.assert_close(cache["enc.out"], kept["out"], rtol=0, atol=TOL[dtype])
    torch.testing.assert_close(cache[names[1]], kept["resid"], rtol=0, atol=TOL[dtype])
    torch.testing.assert_close(logits, theirs, rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_add_a_steering_vector_to_the_decoders_stream_and_generate(case, dtype):
    hf, model = hooked(case, dtype)
    src, decoder_input = ids(), model.decoder_input(ids(length=7, seed=2))
    last = model.model.decoder.n_layers - 1  # the stream out of the last layer: these random models' steerable one
    steer = 20.0 * torch.randn(hf.config.d_model, generator=torch.Generator().manual_seed(4)).to(dtype)
    hooks = [(f"dec.blocks.{last}.resid_post", add(steer))]
    with torch.no_grad():
        ours = model.run_with_hooks(src, decoder_input, hooks=hooks)
        ours_ids = model.generate(src, max_new_tokens=6, hooks=hooks)
        plain_ids = model.generate(src, max_new_tokens=6)

    def theirs_steer(module, args, out):
        return (out[0] + steer, *out[1:]) if isinstance(out, tuple) else out + steer

    with torch.no_grad(), with_hooks(hooks=[(decoder_layers(hf)[last], theirs_steer)]):
        theirs = hf(input_ids=src, decoder_input_ids=decoder_input).logits
        theirs_ids = hf.generate(src, max_new_tokens=6, do_sample=False, num_beams=1, use_cache=False)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=TOL[dtype])
    assert torch.equal(ours_ids, theirs_ids)
    assert not torch.equal(ours_ids, plain_ids)  # the vector changes what is generated
    with torch.no_grad():
        assert torch.equal(plain_ids, hf.generate(src, max_new_tokens=6, do_sample=False, num_beams=1, use_cache=False))


def test_every_site_is_listed_cached_and_parsed_and_hooks_that_change_nothing_keep_the_logits():
    hf, model = hooked("bart", torch.float64)
    src, decoder_input = ids(), model.decoder_input(ids(length=7, seed=2))
    names = model.site_names
    enc, dec = model.model.encoder.n_layers, model.model.decoder.n_layers
    assert len(names) == 4 + 15 * enc + 16 * dec + 1 and len(set(names)) == len(names)
    assert names[:2] == ["enc.embed", "enc.blocks.0.resid_pre"] and names[-1] == "dec.logits"
    assert names.index("dec.blocks.0.cross.z") == names.index("dec.blocks.0.attn_out") + 1
    with torch.no_grad():
        plain = model(src, decoder_input)
        logits, cache = model.run_with_cache(src, decoder_input)
        clones = model.run_with_hooks(src, decoder_input, hooks=[(n, lambda x, s: x.clone()) for n in names])
    assert sorted(cache) == sorted(names)
    for name in names:
        assert parse_stack_site(name)[0] == name.split(".")[0]
    assert cache["dec.blocks.2.cross.z"].shape == (2, 7, 4, 4) and cache["enc.out"].shape == (2, 10, 16)
    assert cache["enc.blocks.1.attn.pattern"].shape == (2, 4, 10, 10)
    torch.testing.assert_close(logits, plain, rtol=0, atol=1e-12)  # the pattern and head-input sites' paths
    torch.testing.assert_close(clones, plain, rtol=0, atol=1e-12)
    torch.testing.assert_close(cache["dec.logits"], plain, rtol=0, atol=1e-12)


def test_a_hook_context_applies_to_loss_and_generate_and_is_removed():
    _, model = hooked("t5_v1_1", torch.float32)
    src, tgt = ids(), ids(length=7, seed=2)

    def zero_all(z, site):
        return torch.zeros_like(z)

    with torch.no_grad():
        plain = model.loss(src, tgt)
        with model.hooks([("dec.blocks.0.cross.z", zero_all)]):
            inside = model.loss(src, tgt)
        after = model.loss(src, tgt)
        direct = model.loss(src, tgt, hooks=[("dec.blocks.0.cross.z", zero_all)])
    assert float(inside) == float(direct) != float(plain) == float(after)


def test_padded_sources_are_masked_and_padded_targets_skipped():
    hf, model = hooked("bart", torch.float64)
    pad = hf.config.pad_token_id
    src, tgt = ids(), ids(length=7, seed=2)
    src_padded, tgt_padded = src.clone(), tgt.clone()
    src_padded[1, 7:], tgt_padded[1, 5:] = pad, pad
    with torch.no_grad():
        ours = model.loss(src_padded, tgt_padded)
        labels = tgt_padded.masked_fill(tgt_padded == pad, -100)
        theirs = hf(input_ids=src_padded, attention_mask=src_padded != pad, labels=labels).loss
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    ("name", "hook", "message"),
    [
        (
            "enc.blocks.0.mlp_out",
            lambda x, s: x.sum(-1),
            r"hooks.site='enc.blocks.0.mlp_out': its hook <lambda> returned \(2, 10\); a hook returns None or a tensor "
            r"of shape \(2, 10, 16\)",
        ),
        (
            "dec.blocks.1.cross.z",
            lambda x, s: 1 / 0,
            r"hooks.site='dec.blocks.1.cross.z': its hook <lambda> raised ZeroDivisionError: division by zero",
        ),
        ("enc.blocks.2.attn.z", lambda x, s: None, r"hooks.site='enc.blocks.2.attn.z': this encoder has layers 0..1"),
        ("enc.logits", lambda x, s: None, r"hooks.site='enc.logits': allowed: enc.embed, enc.out, dec.embed"),
        ("blocks.0.attn.z", lambda x, s: None, r"hooks.site='blocks.0.attn.z': allowed: enc.embed"),
    ],
)
def test_a_bad_hook_or_site_is_one_line_naming_the_site(name, hook, message):
    _, model = hooked("bart", torch.float32)
    with pytest.raises(ConfigError, match=message) as caught, torch.no_grad():
        model.run_with_hooks(ids(), model.decoder_input(ids(length=7, seed=2)), hooks=[(name, hook)])
    assert "\n" not in str(caught.value)


def test_load_model_gives_a_seq2seq_for_a_saved_folder_and_a_preset(tmp_path):
    from seq2seq_helpers import hf_model

    hf = hf_model("t5_v1_1")
    hf.save_pretrained(tmp_path)
    model = headcount.load_model(str(tmp_path))
    assert isinstance(model, HookedSeq2Seq) and not model.model.training
    assert (model.start_id, model.eos_id, model.pad_id) == (0, 1, 0)
    src, tgt = ids(), ids(length=7, seed=2)
    with torch.no_grad():
        torch.testing.assert_close(model.loss(src, tgt), hf(input_ids=src, labels=tgt).loss, rtol=0, atol=1e-5)
    preset = headcount.load_model("nmt_encdec")
    assert isinstance(preset, HookedSeq2Seq) and preset.start_id == 0 and preset.eos_id is None
    with pytest.raises(ConfigError, match="tokens=.*has no tokenizer: pass token ids"):
        preset.to_tokens("a sentence")


def test_a_translation_run_loads_with_the_tasks_ids_and_scores_and_decodes_as_the_finding_does(compose_train, tmp_path):
    import numpy as np
    from omegaconf import OmegaConf

    from headcount.cli.train import run
    from headcount.data.synthetic import BOS
    from headcount.data.translation import EOS, MAX_TARGET, translation_pairs
    from headcount.model.seq2seq import greedy_decode, seq2seq_batch, seq2seq_loss
    from headcount.run_dir import RunPaths

    cfg = compose_train(["experiment=nmt_heads", "size=smoke"])
    run(cfg, tmp_path)
    RunPaths(tmp_path).config.parent.mkdir(exist_ok=True)
    OmegaConf.save(cfg, RunPaths(tmp_path).config)  # what Hydra writes for headcount-train
    model = headcount.load_model(tmp_path)
    from_checkpoint = headcount.load_model(RunPaths(tmp_path).last_ckpt)
    assert isinstance(model, HookedSeq2Seq) and model.tokenizer is None
    assert (
        (model.start_id, model.eos_id, model.pad_id)
        == (BOS, EOS, BOS)
        == (
            from_checkpoint.start_id,
            from_checkpoint.eos_id,
            from_checkpoint.pad_id,
        )
    )
    pairs = translation_pairs(np.random.default_rng(0), 16, cfg.data.vocab_size)
    src, tgt = torch.as_tensor(pairs.source), torch.as_tensor(pairs.target)
    keep = torch.arange(src.shape[1])[None] < torch.as_tensor(pairs.source_lengths)[:, None]
    sources = [row[:n].tolist() for row, n in zip(src, pairs.source_lengths)]
    targets = [row[:n].tolist() for row, n in zip(tgt, pairs.target_lengths)]
    with torch.no_grad():
        expected_ids = greedy_decode(model.model, src, BOS, MAX_TARGET, eos_id=EOS, pad_id=BOS, src_keep=keep)
        assert torch.equal(model.generate(src, MAX_TARGET), expected_ids)
        expected_loss = seq2seq_loss(model.model, seq2seq_batch(sources, targets, BOS, BOS))
        torch.testing.assert_close(model.loss(src, tgt), expected_loss, rtol=0, atol=1e-6)


def word_tokenizer():
    """A word-level fast tokenizer over BART's test vocabulary (pad 0, eos 1), eos appended, built offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran"]
    vocab = {"<pad>": 0, "</s>": 1, "<s>": 2, **{w: 3 + i for i, w in enumerate(words)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<s>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return tf.PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>")


def test_texts_become_padded_source_and_target_ids_and_their_loss_is_transformers():
    hf, model = hooked("bart", torch.float64)
    model.tokenizer = word_tokenizer()
    src = model.to_tokens(["the cat sat on the mat", "a dog ran"])
    tgt = model.to_target_tokens(["a cat sat", "the dog ran on a mat"])
    assert src.tolist() == [[3, 4, 5, 6, 3, 7, 1], [8, 9, 10, 1, 0, 0, 0]]
    assert tgt.tolist() == [[8, 4, 5, 1, 0, 0, 0], [3, 9, 10, 6, 8, 7, 1]]
    assert model.decoder_input(tgt)[:, 0].tolist() == [hf.config.decoder_start_token_id] * 2
    with torch.no_grad():
        ours = model.loss(["the cat sat on the mat", "a dog ran"], ["a cat sat", "the dog ran on a mat"])
        theirs = hf(input_ids=src, attention_mask=src != 0, labels=tgt.masked_fill(tgt == 0, -100)).loss
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-10)

"""Sequence-to-sequence training and decoding (model/seq2seq.py): the teacher-forced loss equals transformers' loss
with labels and the training loss of metrics.py; greedy decoding equals transformers' generate (greedy), plain and
with a head of each kind zero-ablated at every step; a decoded sequence fed back is the argmax of its own
teacher-forced logits; the Lightning module trains an encoder-decoder on a reversal task until greedy decoding gets
every validation example right."""

import lightning as L
import pytest
import torch

from headcount.config.model import AttentionConfig, ModelConfig
from headcount.errors import ConfigError
from headcount.metrics import masked_loss_and_accuracy
from headcount.model.encoder_decoder import gates_off
from headcount.model.seq2seq import greedy_decode, seq2seq_batch, seq2seq_logits, seq2seq_loss
from headcount.run_dir import load_model
from headcount.train.module import HeadcountModule

transformers = pytest.importorskip("transformers")

from seq2seq_helpers import VOCAB, converted, out_projection, t5_norm_in_its_dtype  # noqa: E402


@pytest.fixture(autouse=True)
def t5_norm_variance_in_float64(monkeypatch):
    monkeypatch.setattr(transformers.models.t5.modeling_t5.T5LayerNorm, "forward", t5_norm_in_its_dtype)


def lengths_batch(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    sources = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (7, 12, 9)]
    targets = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (5, 3, 8)]
    return seq2seq_batch(sources, targets, start_id=2, pad_id=0)


@pytest.mark.parametrize("case", ["bart", "t5_v1_0"])
def test_the_teacher_forced_loss_equals_transformers_loss_with_labels(case):
    hf, model = converted(case, torch.float64)
    batch = lengths_batch()
    labels = batch["input_ids"][:, 1:].masked_fill(batch["loss_mask"][:, 1:] == 0, -100)
    with torch.no_grad():
        theirs = hf(
            input_ids=batch["src_ids"],
            attention_mask=batch["src_mask"].long(),
            decoder_input_ids=batch["input_ids"][:, :-1],
            labels=labels,
        ).loss
        ours = seq2seq_loss(model, batch)
        training, _ = masked_loss_and_accuracy(seq2seq_logits(model, batch), batch["input_ids"], batch["loss_mask"])
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-10)
    torch.testing.assert_close(ours, training, rtol=0, atol=1e-12)


def hf_greedy(hf, src, keep, n):
    config = hf.config
    return hf.generate(
        input_ids=src,
        attention_mask=keep.long(),
        do_sample=False,
        num_beams=1,
        max_new_tokens=n,
        min_new_tokens=0,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        decoder_start_token_id=config.decoder_start_token_id,
        no_repeat_ngram_size=0,
        repetition_penalty=1.0,
        forced_bos_token_id=None,
        forced_eos_token_id=None,
        use_cache=False,  # transformers' cache has encoder-many layers: a T5 with more decoder layers fails in it
    )


@pytest.mark.parametrize("case", ["bart", "t5_v1_1"])
def test_greedy_decoding_equals_transformers_generate(case):
    hf, model = converted(case, torch.float64)
    batch = lengths_batch(seed=3)
    src, keep, config = batch["src_ids"], batch["src_mask"], hf.config
    start, eos, pad = config.decoder_start_token_id, config.eos_token_id, config.pad_token_id
    with torch.no_grad():
        ours = greedy_decode(model, src, start, 10, eos, pad, src_keep=keep)
        theirs = hf_greedy(hf, src, keep, 10)
        assert torch.equal(ours, theirs), (ours, theirs)
        for label in ("enc.L1H2", "dec.L2H0", "cross.L0H1"):
            kind, layer, head = label.split(".")[0], int(label[-3]), int(label[-1])
            D = (model.decoder.blocks[0].cross if kind == "cross" else model.decoder.blocks[0].attn).head_dim

            def zero_head(module, args, head=head, D=D):
                z = args[0].clone()
                z[..., head * D : (head + 1) * D] = 0
                return (z,)

            handle = out_projection(hf, kind, layer).register_forward_pre_hook(zero_head)
            try:
                theirs = hf_greedy(hf, src, keep, 10)
            finally:
                handle.remove()
            gates = gates_off(model, [label], dtype=torch.float64)
            assert torch.equal(greedy_decode(model, src, start, 10, eos, pad, src_keep=keep, gates=gates), theirs)


def test_a_decoded_sequence_is_the_argmax_of_its_own_teacher_forced_logits():
    _, model = converted("t5_v1_0", torch.float64)
    batch = lengths_batch(seed=5)
    with torch.no_grad():
        out = greedy_decode(model, batch["src_ids"], 0, 8, src_keep=batch["src_mask"])
        logits = model(batch["src_ids"], out[:, :-1], src_keep=batch["src_mask"])
    assert out.shape == (3, 9) and torch.equal(logits.argmax(-1), out[:, 1:])


def reversal_batches(n_batches: int, seed: int) -> list[dict]:
    """Sources of 3..6 tokens from 3..11; the target is the source reversed, then eos 1."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n_batches):
        sources = [
            torch.randint(3, 12, (int(torch.randint(3, 7, (1,), generator=g)),), generator=g).tolist()
            for _ in range(32)
        ]
        batches.append(seq2seq_batch(sources, [s[::-1] + [1] for s in sources], start_id=2, pad_id=0))
    return batches


def test_the_lightning_module_trains_an_encoder_decoder_that_greedy_decodes_its_task(tmp_path):
    torch.manual_seed(0)
    cfg = {
        "n_layers": 2,
        "encoder_layers": 2,
        "d_model": 32,
        "n_ctx": 16,
        "vocab_size": 12,
        "attn": {"n_heads": 4},
        "cross_attn": {"n_heads": 2},
        "mlp": True,
    }
    optim = {"lr": 3e-3, "weight_decay": 0.0, "beta1": 0.9, "beta2": 0.98, "warmup_steps": 20, "min_lr_ratio": 0.1}
    module = HeadcountModule(cfg, optim, max_steps=400)
    trainer = L.Trainer(
        max_steps=400,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        default_root_dir=tmp_path,
    )
    train = reversal_batches(25, seed=0)
    loader = torch.utils.data.DataLoader
    trainer.fit(module, loader(train, batch_size=None), loader(reversal_batches(1, seed=1), batch_size=None))
    model = module.model.eval()
    val = reversal_batches(1, seed=2)[0]
    with torch.no_grad():
        decoded = greedy_decode(model, val["src_ids"], 2, 8, eos_id=1, pad_id=0, src_keep=val["src_mask"])
        loss = seq2seq_loss(model, val)
    expected = val["input_ids"][:, : decoded.shape[1]]
    assert loss < 0.1 and torch.equal(decoded, expected)
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    reloaded = load_model(tmp_path / "last.ckpt")
    with torch.no_grad():
        assert torch.equal(seq2seq_logits(reloaded, val), seq2seq_logits(model, val))


def test_an_encoder_decoder_without_source_sequences_is_refused_in_one_line():
    cfg = ModelConfig(n_layers=1, encoder_layers=1, d_model=16, vocab_size=12, attn=AttentionConfig(n_heads=2))
    module = HeadcountModule(dataclass_dict(cfg), {}, max_steps=1)
    with pytest.raises(ConfigError, match=r"model.encoder_layers=1: needs a data source with source sequences"):
        module.training_step({"input_ids": torch.zeros(1, 4, dtype=torch.long)}, 0)


def dataclass_dict(cfg: ModelConfig) -> dict:
    import dataclasses

    return dataclasses.asdict(cfg)

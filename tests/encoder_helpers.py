"""Tiny random transformers encoders (BERT, RoBERTa, DistilBERT, ELECTRA), built from their config classes (no
download), with every feature binding: token types drawn at random, RoBERTa's position offset, ELECTRA's narrower
embeddings, exact and tanh GELU, masked-LM heads and bare encoders."""

import torch
import transformers as tf

from headcount.pretrained import convert

VOCAB, T = 60, 10
BERT = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 48,
    "max_position_embeddings": 24,
    "type_vocab_size": 3,
    "layer_norm_eps": 1e-7,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
DISTILBERT = {"vocab_size": VOCAB, "dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 48}

CASES = {
    "bert_mlm_tanh_gelu": lambda: tf.BertConfig(**BERT, hidden_act="gelu_new"),
    "bert_bare": lambda: tf.BertConfig(**BERT, architectures=["BertModel"]),
    "roberta_mlm": lambda: tf.RobertaConfig(**BERT, pad_token_id=1),
    "distilbert_mlm": lambda: tf.DistilBertConfig(**DISTILBERT, max_position_embeddings=24, sinusoidal_pos_embds=True),
    "electra_mlm_narrow_embeddings": lambda: tf.ElectraConfig(**BERT, embedding_size=16),
}


def hf_model(case: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.nn.Module:
    """A transformers encoder with every weight random (norms and biases too), eager attention, in eval mode."""
    torch.manual_seed(seed)
    config = CASES[case]()
    auto = tf.AutoModel if config.architectures else tf.AutoModelForMaskedLM
    model = auto.from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return model.to(dtype).eval()


def converted(case: str, dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, torch.nn.Module]:
    hf = hf_model(case, dtype)
    return hf, convert(hf)


def inputs(case: str, batch: int = 3, seed: int = 1) -> dict[str, torch.Tensor]:
    """Token ids without pad tokens (RoBERTa's pad id is 1) and, where the model has them, random token types."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (batch, T), generator=g)
    if case.startswith("distilbert"):
        return {"input_ids": ids}
    return {"input_ids": ids, "token_type_ids": torch.randint(0, 3, (batch, T), generator=g)}


def hf_output(hf: torch.nn.Module, case: str) -> torch.Tensor:
    out = hf(**inputs(case))
    return out.last_hidden_state if case.endswith("bare") else out.logits


def our_output(model: torch.nn.Module, case: str, intervention=None) -> torch.Tensor:
    """The logits, or for a bare encoder the stream after the last layer (its hidden states)."""
    x = inputs(case)
    types = x.get("token_type_ids") if model.type_emb is not None else None
    if case.endswith("bare"):
        return model.forward_layers(model.embed(x["input_ids"], types), 0, intervention)
    return model(x["input_ids"], intervention, token_types=types)


def out_projection(hf: torch.nn.Module, layer: int) -> torch.nn.Module:
    """The module whose input is layer's concatenated heads."""
    if hf.config.model_type == "distilbert":
        return hf.base_model.transformer.layer[layer].attention.out_lin
    return hf.base_model.encoder.layer[layer].attention.output.dense

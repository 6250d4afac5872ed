"""`headcount:tiny-random-bert`, a built-in encoder source for CI-sized runs with no download: a bare BERT (BertModel,
as all-MiniLM-L6-v2 is: 2 layers x 4 heads, width 32, context 128), random weights from seed 0, and a character-level
WordPiece tokenizer (lower-cased printable ASCII, each character also as a "##" continuation, and BERT's [PAD],
[UNK], [CLS], [SEP] and [MASK]), so English text reads as BERT's inputs do. Written once to
<cache>/pretrained/tiny-random-bert-v1 (pretrained/tiny_random.py's cache), then read like any checkpoint folder.
"""

from pathlib import Path

import torch

from headcount.pretrained.tiny_random import cache_folder, written

NAME = "headcount:tiny-random-bert"
FOLDER = "tiny-random-bert-v1"  # bump when the recipe changes
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
CHARACTERS = [chr(c) for c in range(ord("!"), ord("~") + 1) if not chr(c).isupper()]
VOCAB = [*SPECIAL, *CHARACTERS, *(f"##{c}" for c in CHARACTERS)]
CONFIG = dict(
    vocab_size=len(VOCAB),
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=128,
    type_vocab_size=2,
    architectures=["BertModel"],
    pad_token_id=0,
)


def tiny_random_bert() -> Path:
    return written(cache_folder(FOLDER), NAME, save)


def save(folder: Path) -> None:
    import transformers as tf

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = tf.BertModel(tf.BertConfig(**CONFIG))  # its pooler too, as the checkpoint check expects
    model.save_pretrained(folder)
    tf.BertTokenizerFast(vocab={token: i for i, token in enumerate(VOCAB)}, do_lower_case=True).save_pretrained(folder)

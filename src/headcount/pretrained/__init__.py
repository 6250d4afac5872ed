"""Pretrained models from Hugging Face, converted exactly into headcount's Transformer.

    from headcount.pretrained import load_pretrained
    model, tokenizer, provenance = load_pretrained("HuggingFaceTB/SmolLM2-135M")  # or a folder, or a .gguf file

Supported families (transformers' model_type): gpt2; llama (Llama 1/2/3.x, SmolLM, ...), mistral, qwen2, qwen3,
olmo2 and phi3 (llama.py); gemma, gemma2, gemma3_text and gemma3 (gemma.py); gpt_neox (Pythia).
`convert(hf_model)` converts a transformers model already in memory, `hf_model_config(hf_config)` and
`pretrained_config(source)` give the ModelConfig a checkpoint implies. transformers and gguf are optional
(`pip install 'headcount[pretrained]'`); they are imported only when a checkpoint is read.

This package sits above model/ in the import order (it imports errors, config and model) and below the commands.
"""

from headcount.pretrained.convert import convert, hf_model_config
from headcount.pretrained.families import SUPPORTED
from headcount.pretrained.load import Pretrained, load_pretrained, pretrained_config

__all__ = ["SUPPORTED", "Pretrained", "convert", "hf_model_config", "load_pretrained", "pretrained_config"]

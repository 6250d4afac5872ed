"""A GGUF file's weights de-quantised one tensor at a time, as the family converter asks for them.

transformers' GGUF loader de-quantises every tensor into one dictionary before it builds the model, and then copies
them in: its peak memory is about three times the float32 weights (measured: docs/BENCHMARKS.md). Here the same
pieces of transformers (its config reader, its name map and its architecture's tensor processor) run per tensor,
when the converter takes it, and large tensors are de-quantised a slice of rows at a time into their final array, so
the peak stays near one copy of the converted weights. What transformers checks (a tensor missing, left over or of
another shape) is checked before the first tensor is de-quantised, with integrity.py's messages.
"""

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from headcount.pretrained.integrity import check_loaded
from headcount.pretrained.source import Source
from headcount.pretrained.weights import HFWeights

ROWS_PER_SLICE = 4096  # rows de-quantised at once: bounds the de-quantiser's temporaries, not the result


class StreamedWeights(HFWeights):
    """HFWeights whose values are made when taken: each a function that de-quantises its tensor. A name tied to
    another (the unembedding tied to the embedding) is the same tensor, made once."""

    def __init__(self, makers: dict[str, Callable[[], Tensor]], tied: dict[str, str], model_type: str, bar: Any):
        super().__init__(makers, model_type)
        self.tied, self.made, self.bar = tied, {}, bar

    def take(self, name: str) -> Tensor:
        return self.made_tensor(name, super().take(name))

    def take_optional(self, name: str) -> Tensor | None:
        maker = super().take_optional(name)
        return None if maker is None else self.made_tensor(name, maker)

    def made_tensor(self, name: str, maker: Callable[[], Tensor]) -> Tensor:
        key = self.tied.get(name, name)
        if key in self.made:  # the twin of a tensor already made
            return self.made.pop(key)
        tensor = maker()
        self.bar.update()
        if key != name or key in self.tied.values():
            self.made[key] = tensor
        if not self.params:
            self.bar.close()
        return tensor


def architecture_only(reader: Any) -> str:
    """The architecture a GGUF file's metadata names; the reader (gguf's GGUFReader) keeps its tensor table and drops
    the rest of the metadata, a vocabulary among it, which takes hundreds of MB parsed and which transformers reads
    itself for the config and the tokenizer."""
    architecture = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
    reader.fields.clear()
    return architecture


def read_gguf(
    transformers: Any, where: Source, reader: Any, architecture: str, hf_config: Any, verbose: bool
) -> StreamedWeights:
    """The weights of the GGUF file `where` (its tensor table read by reader, of architecture_only's architecture)
    under transformers' names for hf_config's model (made when taken), after the checks transformers' loading info
    allows (check_loaded: a ConfigError naming what is missing, left over or of another shape)."""
    from accelerate import init_empty_weights
    from tqdm.auto import tqdm
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    with init_empty_weights():  # the model only names the tensors and gives their shapes: no memory
        hf_model = transformers.AutoModelForCausalLM.from_config(hf_config)
    hf_model.tie_weights()  # as from_pretrained does: a tied unembedding is the embedding's parameter
    path = Path(where.location) / where.gguf_file
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=hf_config.to_dict())
    mapping = get_gguf_hf_weights_map(hf_model, processor)
    makers, found, unread = {}, {}, []
    for tensor in reader.tensors:
        # A read-only array of zeros that takes no memory: the processor says what the tensor becomes, de-quantising
        # nothing.
        shape = tuple(int(n) for n in reversed(tensor.shape))
        made = processed(processor, mapping, tensor.name, np.broadcast_to(np.float32(0), shape))
        unread += [] if made else [tensor.name]
        for name, array in made:
            found[name] = tuple(array.shape)
            makers[name] = tensor_maker(tensor, processor, mapping, name, path)
    needed = dict(hf_model.named_parameters(remove_duplicate=False))
    first_of = {}
    for name, param in needed.items():
        first_of.setdefault(id(param), name)
    tied = {name: first_of[id(p)] for name, p in needed.items() if first_of[id(p)] != name and name not in makers}
    missing = [name for name in needed if name not in makers and name not in tied]
    mismatched = [(n, found[n], tuple(needed[n].shape)) for n in makers if found[n] != tuple(needed[n].shape)]
    check_loaded(where, {"missing_keys": missing, "mismatched_keys": mismatched}, hf_model, unread)
    for name, twin in tied.items():
        makers[name] = makers[twin]
    bar = tqdm(total=len(makers) - len(tied), desc="Converting and de-quantizing GGUF tensors", disable=not verbose)
    return StreamedWeights(makers, tied, hf_config.model_type, bar)


def processed(processor: Any, mapping: dict, gguf_name: str, weights: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """What transformers' tensor processor makes of one GGUF tensor: (its transformers name, its array) for each
    tensor it gives (none for one the name map does not know), as transformers' load_gguf_checkpoint reads it."""
    stored = {"tensors": {}}  # where a processor puts a tensor it names itself (GPT-2's output.weight)
    result = processor.process(weights=weights, name=gguf_name, tensor_key_mapping=mapping, parsed_parameters=stored)
    out = list(stored["tensors"].items())
    if result.name is not None and result.name in mapping:
        out.append((mapping[result.name], result.weights))
    return out


def tensor_maker(tensor: Any, processor: Any, mapping: dict, name: str, path: Path) -> Callable[[], Tensor]:
    def make() -> Tensor:
        array = dict(processed(processor, mapping, tensor.name, dequantized(tensor, path)))[name]
        if isinstance(array, Tensor):
            return array.float()
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))

    return make


def dequantized(tensor: Any, path: Path) -> np.ndarray:
    """A GGUF tensor in float32 in numpy's row order, a slice of rows at a time (so the de-quantiser's temporaries
    stay small), each slice's bytes read from the file rather than through the reader's mapping of it: pages of a
    mapping that were read count in the process's memory for as long as it is mapped, as much as the file again."""
    from gguf import dequantize

    shape, kind = tensor.data.shape, tensor.tensor_type  # the stored layout (blocks of bytes for a quantised type)
    rows = shape[0] if len(shape) > 1 else 1
    row_shape = shape[1:] if len(shape) > 1 else shape
    row_bytes = tensor.n_bytes // rows
    out = None
    with open(path, "rb", buffering=0) as f:
        for start in range(0, rows, ROWS_PER_SLICE):
            n = min(ROWS_PER_SLICE, rows - start)
            raw = os.pread(f.fileno(), n * row_bytes, tensor.data_offset + start * row_bytes)
            stored = np.frombuffer(raw, dtype=tensor.data.dtype).reshape(n, *row_shape)
            values = dequantize(stored, kind)
            if out is None:
                out = np.empty((rows, *values.shape[1:]), dtype=np.float32)
            out[start : start + n] = values
    return out if len(shape) > 1 else out.reshape(out.shape[1:])

"""Moving a Hugging Face state dict into headcount's names, with nothing left behind unnoticed."""

from torch import Tensor


class HFWeights:
    """A Hugging Face model's parameters by name. `take` removes what it returns, so `check_all_taken` can prove the
    conversion used every weight: a weight a family module does not know is an error, never silently dropped."""

    def __init__(self, params: dict[str, Tensor], model_type: str):
        self.params, self.model_type = dict(params), model_type

    def take(self, name: str) -> Tensor:
        if name not in self.params:
            raise KeyError(f"{self.model_type} checkpoint has no weight {name!r}")
        return self.params.pop(name)

    def take_optional(self, name: str) -> Tensor | None:
        return self.params.pop(name, None)

    def take_linear(self, prefix: str, transpose: bool = False) -> tuple[Tensor, Tensor | None]:
        """A projection's weight (out, in) and its bias or None; `transpose` for GPT-2's Conv1D (in, out)."""
        weight = self.take(f"{prefix}.weight")
        return (weight.T if transpose else weight), self.take_optional(f"{prefix}.bias")

    def check_all_taken(self) -> None:
        if self.params:
            left = ", ".join(sorted(self.params)[:5])
            raise ValueError(f"converting {self.model_type} left {len(self.params)} weights unused: {left}")


def put_linear(state: dict[str, Tensor], prefix: str, weight: Tensor, bias: Tensor | None) -> None:
    state[f"{prefix}.weight"] = weight
    if bias is not None:
        state[f"{prefix}.bias"] = bias


def put_norm(state: dict[str, Tensor], prefix: str, hf: HFWeights, hf_prefix: str) -> None:
    """A LayerNorm (weight and bias) or an RMSNorm (weight only)."""
    put_linear(state, prefix, hf.take(f"{hf_prefix}.weight"), hf.take_optional(f"{hf_prefix}.bias"))

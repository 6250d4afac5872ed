"""The position-wise MLP: fc -> activation -> proj, or a gated one, SwiGLU's proj(silu(gate x) * fc x) (Llama) or
GeGLU's proj(gelu_tanh(gate x) * fc x) (Gemma, T5 v1.1), with any hidden width; the ungated activation is GELU
(exact or tanh), ReLU (T5 v1.0) or SiLU (Marian). Parameter names (fc, proj, gate) are those
checkpoints store."""

from collections.abc import Callable

from torch import Tensor, nn
from torch.nn import functional as F

from headcount.config.model import Activation, ModelConfig

UNGATED = {Activation.relu: F.relu, Activation.silu: F.silu}


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, hidden, bias = cfg.d_model, cfg.mlp_hidden or cfg.mlp_ratio * cfg.d_model, cfg.mlp_bias
        self.act = cfg.mlp_act
        self.fc, self.proj, self.drop = nn.Linear(d, hidden, bias), nn.Linear(hidden, d, bias), nn.Dropout(cfg.dropout)
        gated = self.act in (Activation.swiglu, Activation.geglu_tanh)
        self.gate = nn.Linear(d, hidden, bias) if gated else None

    def forward(self, x_BTC: Tensor, hidden_hook: Callable[[Tensor], Tensor] | None = None) -> Tensor:
        """hidden_hook: applied to the hidden units (B, T, F) before the output projection (an intervention's)."""
        if self.gate is not None:
            gate = self.gate(x_BTC)
            act = F.silu(gate) if self.act == Activation.swiglu else F.gelu(gate, approximate="tanh")
            hidden_BTF = act * self.fc(x_BTC)
        elif self.act in UNGATED:
            hidden_BTF = UNGATED[self.act](self.fc(x_BTC))
        else:
            approximate = "tanh" if self.act == Activation.gelu_tanh else "none"
            hidden_BTF = F.gelu(self.fc(x_BTC), approximate=approximate)
        if hidden_hook is not None:
            hidden_BTF = hidden_hook(hidden_BTF)
        return self.drop(self.proj(hidden_BTF))

    def activation_floats(self) -> int:
        """What it holds per position: the hidden layer before and after the nonlinearity (SwiGLU: gate, up, the
        gate's activation and the product)."""
        return (4 if self.gate is not None else 2) * self.fc.out_features

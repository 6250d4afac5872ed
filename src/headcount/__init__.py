"""headcount: attention-head ablation studies on configurable transformers."""

__version__ = "0.1.0"

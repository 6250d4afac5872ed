"""headcount: attention-head ablation studies on configurable transformers.

The Python API: `headcount.load_run(run_dir)` opens a finished run as a `headcount.Run` (headcount/api.py);
`headcount.load_model(source)` opens a bare model with its tokenizer for interventions at named sites, a
`headcount.HookedModel` (headcount/api_model.py), or for an encoder-decoder a `headcount.HookedSeq2Seq`
(headcount/api_seq2seq.py).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("headcount")  # single-sourced from pyproject.toml's [project] version
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"
__all__ = ["HookedModel", "HookedSeq2Seq", "Run", "load_model", "load_run"]
_MODULES = {
    "Run": "api",
    "load_run": "api",
    "HookedModel": "api_model",
    "HookedSeq2Seq": "api_seq2seq",
    "load_model": "api_model",
}


def __getattr__(name: str):
    # The API imports torch and every stage; importing it on first use keeps `import headcount.<module>` light.
    if name in _MODULES:
        from importlib import import_module

        return getattr(import_module(f"headcount.{_MODULES[name]}"), name)
    raise AttributeError(f"module 'headcount' has no attribute {name!r}")

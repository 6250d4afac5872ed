"""headcount: attention-head ablation studies on configurable transformers.

The Python API (headcount/api.py): `headcount.load_run(run_dir)` opens a finished run as a `headcount.Run`.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("headcount")  # single-sourced from pyproject.toml's [project] version
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"
__all__ = ["Run", "load_run"]


def __getattr__(name: str):
    # The API imports torch and every stage; importing it on first use keeps `import headcount.<module>` light.
    if name in __all__:
        from headcount import api

        return getattr(api, name)
    raise AttributeError(f"module 'headcount' has no attribute {name!r}")

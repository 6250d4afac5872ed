"""Tests never touch the network: W&B offline, Hugging Face offline, caches in a temporary folder."""

import os

import pytest

from headcount.threads import passive_threads_by_default

# Before torch loads, which reads it once: each worker's OpenMP threads sleep while they wait, unless the user chose a
# policy or a thread count (headcount/threads.py); the commands the tests start inherit it.
passive_threads_by_default()

import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.core.global_hydra import GlobalHydra  # noqa: E402

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.pop("WANDB_API_KEY", None)
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("WANDB_SILENT", "true")

from headcount.config import CONF_DIR, register_configs  # noqa: E402

register_configs()


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """Test-sized tensors run fastest on one thread, which also keeps them fast when other processes share the cores."""
    torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    os.environ["HEADCOUNT_CACHE"] = str(tmp_path_factory.mktemp("headcount-cache"))


@pytest.fixture
def compose_train():
    """compose_train(overrides) -> the composed train config, as `headcount-train <overrides>` would see it."""

    def _compose(overrides=(), config_name="train"):
        GlobalHydra.instance().clear()
        with initialize_config_dir(CONF_DIR, version_base="1.3"):
            return compose(config_name, overrides=list(overrides), return_hydra_config=False)

    return _compose

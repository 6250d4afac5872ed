"""The Hugging Face Hub without a network: read the Hugging Face caches at once, instead of letting huggingface_hub
retry each file for half a minute (a warning per try) before it fails. Pretrained models (pretrained/source.py) and
Hub datasets (data/text.py) both go through here."""

import os
import socket
from urllib.parse import urlparse


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the Hub's host answers a TCP connection within timeout_s."""
    from huggingface_hub import constants

    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout_s).close()
        return True
    except OSError:
        return False


def offline_without_network() -> None:
    """Go offline (the caches only) when the Hub does not answer, for transformers and datasets alike."""
    from huggingface_hub import constants

    if not constants.HF_HUB_OFFLINE and not hub_reachable():
        constants.HF_HUB_OFFLINE = True
        os.environ["HF_HUB_OFFLINE"] = "1"
        try:  # datasets copies the setting when it is imported
            import datasets.config

            datasets.config.HF_HUB_OFFLINE = True
        except ImportError:
            pass

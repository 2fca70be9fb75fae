"""Fixtures of the generator tests that run a real model."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def offline() -> Iterator[None]:
    """Nothing may come from a hub. huggingface_hub reads HF_HUB_OFFLINE when imported, which
    collection has done already, so its constant is set too."""
    import huggingface_hub.constants as hub

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setattr(hub, "HF_HUB_OFFLINE", True)
        yield

"""What every test of the example components shares."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread, and the CI machine's two cores are shared with the other
    pytest worker."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

"""Fixtures shared by the core's tests."""

import pytest

from tvm_combiners.core.graph import Reachability


@pytest.fixture
def contractions(monkeypatch):
    """The members of every ``Reachability.contract`` call, in order (the exact way's cost)."""
    seen: list[list[int]] = []
    real = Reachability.contract

    def contract(self, members):
        seen.append(list(members))
        return real(self, members)

    monkeypatch.setattr(Reachability, "contract", contract)
    return seen

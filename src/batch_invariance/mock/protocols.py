"""What the mock's HTTP surface reads of the slot engine behind it.

:class:`~batch_invariance.mock.engine.MockServer` implements it; the handler in
:mod:`batch_invariance.mock.http` imports only this, so the engine can name its handler
without the two importing each other.
"""

from __future__ import annotations

from typing import Any, Protocol

from batch_invariance.mock.knobs import Generation, MockKnobs, MockStats

__all__ = ["MockState"]


class MockState(Protocol):
    """The running mock as its HTTP handler sees it."""

    parallel: int
    ctx: int
    knobs: MockKnobs
    #: What it served so far (other engines' fake surfaces report from it).
    stats: MockStats

    @property
    def loading(self) -> bool: ...

    @property
    def dead(self) -> bool: ...

    def busy_count(self) -> int: ...

    def slots_json(self) -> list[dict[str, Any]]: ...

    def metrics_text(self) -> str: ...

    def fails_now(self, prompt_text: str) -> bool: ...

    def generate(
        self, prompt_text: str, n_predict: int, cache_prompt: bool = False
    ) -> Generation: ...

    def count_answer(self) -> None: ...

"""The serving engine's words in a verdict's reasons (:class:`~batch_invariance.core.
findings.EngineAdvice`), looked up by the engine a cert's provenance names.

The core names no engine: whoever decides a verdict passes these words, the service layer
when it finishes a cell (:func:`batch_invariance.service.finish.finish_cell`) and the
verification when it re-derives a cert (:func:`batch_invariance.cert.build.rederive`, which
takes this reader as :data:`~batch_invariance.cert.build.AdviceReader`). Both read them from
the same recorded engine, so a cert re-derives to its own words.
"""

from __future__ import annotations

from batch_invariance.core.findings import NO_ADVICE, EngineAdvice
from batch_invariance.engines.registry import ENGINES

__all__ = ["engine_advice"]


def engine_advice(engine_name: str) -> EngineAdvice:
    """The words of the engine named ``engine_name`` (a cert's ``provenance.engine_name``);
    none for an engine this tool does not know."""
    engine = ENGINES.get(engine_name)
    return NO_ADVICE if engine is None else EngineAdvice(cache_off=engine.cache_off_advice)

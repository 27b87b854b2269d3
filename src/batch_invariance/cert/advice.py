"""The serving engine's words in a verdict's reasons (:class:`~batch_invariance.core.
findings.EngineAdvice`), looked up by the engine a cert's provenance names.

The core names no engine: whoever decides a verdict passes these words, the service layer
when it finishes a cell (:func:`batch_invariance.service.finish.finish_cell`) and the
verification when it re-derives a cert (:func:`batch_invariance.cert.build.rederive`, which
takes this reader as :data:`~batch_invariance.cert.build.AdviceReader`). Both read them from
the same recorded engine, so a cert re-derives to its own words.

Rules 1 (:data:`batch_invariance.core.rules.RULES_VERSION`) wrote llama-server's switches
into every cert's reasons, whichever engine served it. The reasons are compared word for word
when a cert is re-derived, so under rules 1 every engine keeps those words; each engine's own
(:attr:`~batch_invariance.engines.base.Engine.cache_off_advice`) is for the next rules
version, where the changed wording is a changed rule.
"""

from __future__ import annotations

from batch_invariance.core.findings import EngineAdvice
from batch_invariance.engines.registry import ENGINES

__all__ = ["engine_advice"]


#: The words every rules-1 cert carries (llama-server's, as the core wrote them before).
RULES_1_ADVICE = EngineAdvice(cache_off=ENGINES["llama-server"].cache_off_advice)


def engine_advice(engine_name: str) -> EngineAdvice:
    """The words a verdict of a cell served by ``engine_name`` (a cert's
    ``provenance.engine_name``) gives: under rules 1, llama-server's for every engine."""
    del engine_name  # the engine's own words wait for a rules change (see the module's text)
    return RULES_1_ADVICE

"""An in-process llama-server look-alike on loopback, for fast tests and the mock demo.

:class:`MockServer` serves the endpoints the driver uses (``/health``, ``/props``, ``/slots``,
``/metrics``, ``/completion``, ``/v1/completions``, ``/v1/chat/completions``, ``/tokenize``)
from a ``ThreadingHTTPServer`` on ``127.0.0.1`` and a free port, with N real concurrent slots.
Completions come from :mod:`.oracle` (right answers to known prompt shapes); :class:`MockKnobs`
injects the faults the verdict must tell apart; :class:`MockLauncher` implements
``run.cell.ServerLauncher`` over it.

This is never a substitute for the real server: certs from it are ``source=mock``.
"""

from batch_invariance.mock.engine import MockServer
from batch_invariance.mock.knobs import Generation, MockKnobs, MockStats
from batch_invariance.mock.launcher import MockHandle, MockLauncher, wait_ready
from batch_invariance.mock.oracle import answer_for, diverged_answer, token_id, tokenize

__all__ = [
    "Generation",
    "MockHandle",
    "MockKnobs",
    "MockLauncher",
    "MockServer",
    "MockStats",
    "answer_for",
    "diverged_answer",
    "token_id",
    "tokenize",
    "wait_ready",
]

"""``serve``'s CPU rule: a llama.cpp build that picks its CPU kernels at start
(``GGML_CPU_ALL_VARIANTS``) runs the measured kernels only on a CPU with the SIMD features the
cert's host had. Only the serving host knows its CPU, so check-deploy cannot hold a deploy to
this; ``serve`` does, at start.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from batch_invariance.engines.base import BuildLibraries

#: ggml's CPU backend built in variants (``GGML_CPU_ALL_VARIANTS``: ``libggml-cpu-haswell.so``,
#: ``libggml-cpu-skylakex.so``, ...), one of which ggml loads at start by the CPU's features.
_CPU_VARIANT = re.compile(r"(?:^|/)libggml-cpu-[A-Za-z0-9_]+\.so(?:\.|$)")


def cpu_variant_problem(
    found: BuildLibraries | None, host: Mapping[str, object] | None, here: Sequence[str]
) -> str | None:
    """Why a build that picks its CPU kernels at start cannot be the measured one on this CPU
    (``None``: it picks none, or this CPU has the SIMD features the cert's host had, so ggml
    picks the variant it measured). ``serve``'s rule: only the serving host knows its CPU."""
    variants = sorted(n for n, _ in (found.sha256 if found else ()) if _CPU_VARIANT.search(n))
    if not variants:
        return None
    measured = (host or {}).get("cpu_flags")
    picks = f"this build picks its CPU kernels at start by the CPU's features ({variants[0]}, ...)"
    if not isinstance(measured, list):
        return f"{picks} and the cert records none of its host's: re-measure on this CPU"
    if sorted(map(str, measured)) != sorted(here):
        return (
            f"{picks}: the cert measured a CPU with {' '.join(map(str, measured)) or 'none'}, "
            f"this one has {' '.join(here) or 'none'}: measure the cell on this CPU"
        )
    return None

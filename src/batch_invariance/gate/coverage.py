"""The coverage rules: each one thing a cert must have measured as a deploy cell runs it, a
function returning the differences (empty = the same), asked in the order of
:data:`COVERAGE_RULES` (the order their differences are printed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from batch_invariance.cert.provenance import Provenance
from batch_invariance.core.gpu_placement import placement_differences
from batch_invariance.engines.llama_server.env import engine_env
from batch_invariance.engines.llama_server.flags import (
    FlagError,
    numerics_differences,
    padded_context,
    slot_layout,
)
from batch_invariance.engines.variables import Linked
from batch_invariance.gate.cells import DeployCell
from batch_invariance.gate.certs import CertFile, measured_length
from batch_invariance.gate.identity import ModelIdentity, model_differences
from batch_invariance.gate.prompt_cache import cache_differences, is_cache_difference
from batch_invariance.gate.sequence_scope import sequence_problem


def engine_env_differences(
    deploy: Mapping[str, str], provenance: Provenance, linked: Linked = None
) -> tuple[str, ...]:
    """Variables ggml or the runtimes read that the deploy sets differently from the B/C
    server the cert measured (its recorded ``engine_env``; none recorded = none set).

    ``linked``: the runtimes the deploy's build links (``None``: not known, every runtime's);
    a variable that build cannot read is compared on neither side (``deploy`` was read by
    that rule), so a cert an older tool recorded with a variable the build never read (an
    ``OPENBLAS_*`` of the measuring host's for a build without OpenBLAS) still covers it."""
    server = provenance.bc_server()
    info = server.info if server is not None else None
    recorded = info.engine_env if info is not None else None
    # A GPU-selection variable an older cert recorded is placement, not an engine variable.
    measured: Mapping[str, str] = engine_env(recorded or {}, linked)
    return tuple(
        f"environment {name}={deploy.get(name, '(unset)')} (measured "
        f"{measured.get(name, '(unset)')})"
        for name in sorted(set(deploy) | set(measured))
        if deploy.get(name) != measured.get(name)
    )


class CoverageRule(Protocol):
    """One thing a cert must have measured as the cell runs it: the differences (empty =
    the same). Rules are separate and composable: a new check is one more function in
    :data:`COVERAGE_RULES`, over the parsed deploy (``cell.flags``, ``cell.engine_env``)."""

    def __call__(
        self, cell: DeployCell, cert: CertFile, model: ModelIdentity
    ) -> tuple[str, ...]: ...


def model_rule(cell: DeployCell, cert: CertFile, model: ModelIdentity) -> tuple[str, ...]:
    """The model file is the one measured (by the strongest identity available)."""
    return model_differences(model, cert.provenance)


def layout_rule(cell: DeployCell, cert: CertFile, model: ModelIdentity) -> tuple[str, ...]:
    """N and the KV layout (and a unified pool's size) are the measured ones."""
    measured = cert.measured
    if measured is None:
        return ("the cert records no B/C server argv (layout and flags unknown)",)
    try:
        layout = slot_layout(measured)
    except FlagError as exc:
        return (f"the recorded B/C argv is not readable ({exc})",)
    out: list[str] = []
    if layout.parallel != cell.parallel:
        out.append(f"N {cell.parallel} (measured {layout.parallel})")
    if layout.kv_unified != cell.layout.kv_unified:
        measured_name = "unified" if layout.kv_unified else "split"
        out.append(f"KV layout {cell.layout_name} (measured {measured_name})")
    elif cell.layout.kv_unified:
        pool = padded_context(measured.ctx_size or 0, layout).pool
        if pool != cell.pool:
            out.append(f"unified KV pool of {cell.pool} tokens (measured {pool})")
    return tuple(out)


def options_rule(cell: DeployCell, cert: CertFile, model: ModelIdentity) -> tuple[str, ...]:
    """Every option that is not neutral has the measured value."""
    if cert.measured is None:
        return ()
    # The prompt-cache options are the prompt-cache rule's (deploy/prompt_cache.py).
    compared = numerics_differences(cell.flags, cert.measured)
    return tuple(d for d in compared if not is_cache_difference(d))


def prompt_cache_rule(cell: DeployCell, cert: CertFile, model: ModelIdentity) -> tuple[str, ...]:
    """A server that caches prompts is covered only by a cert that measured that caching."""
    return cache_differences(cell.flags, cert.cache_measured)


def environment_rule(cell: DeployCell, cert: CertFile, model: ModelIdentity) -> tuple[str, ...]:
    """The variables the engine reads are the recorded ones."""
    return engine_env_differences(cell.engine_env, cert.provenance, cell.linked)


def answer_length_rule(cell: DeployCell, cert: CertFile, model: ModelIdentity) -> tuple[str, ...]:
    """A fixed ``-n`` cap was measured; an uncapped deploy needs a measured length."""
    limit = cell.flags.n_predict
    longest = measured_length(cert)
    if limit is not None and limit > 0:
        if longest is None:
            return (f"-n {limit}: the cert records no measured answer length",)
        if longest < limit:
            return (f"-n {limit}: the cert measured answers up to {longest} tokens only",)
    elif uncapped(cell) and longest is None:
        return ("no -n cap: the cert records no measured answer length to scope a pass to",)
    return ()


def gpu_rule(cell: DeployCell, cert: CertFile, model: ModelIdentity) -> tuple[str, ...]:
    """The GPUs the deploy selects on this host are the ones measured (where both are read)."""
    return placement_differences(cert.provenance.gpus, cell.gpus).differences


def sequence_length_rule(cell: DeployCell, cert: CertFile, model: ModelIdentity) -> tuple[str, ...]:
    """The measured sequences reach 3/4 of the longest sequence one slot of the deploy can
    hold (:func:`sequence_problem`): its share of a split cache, the whole pool of a unified
    one (llama-server lets any slot fill a unified pool: its log says ``n_ctx_slot`` = the
    pool), whatever share of it the cert's ``ctx`` names."""
    if cell.ctx is None:  # check_cell refuses such a cell before any rule runs
        return ("context per slot unknown",)
    longest = cell.pool if cell.layout.kv_unified and cell.pool is not None else cell.ctx
    problem = sequence_problem(cert.sequence_scope, longest)
    return () if problem is None else (problem,)


#: The coverage checks, in the order their differences are printed.
COVERAGE_RULES: tuple[CoverageRule, ...] = (
    model_rule, layout_rule, options_rule, prompt_cache_rule, environment_rule,
    answer_length_rule, sequence_length_rule, gpu_rule,
)  # fmt: skip


def config_differences(
    cell: DeployCell,
    cert: CertFile,
    model: ModelIdentity,
    rules: Sequence[CoverageRule] = COVERAGE_RULES,
) -> tuple[str, ...]:
    """Everything the cert measured differently from what the cell runs (empty = same)."""
    return tuple(difference for rule in rules for difference in rule(cell, cert, model))


def uncapped(cell: DeployCell) -> bool:
    """The deploy sets no answer-length cap (no ``-n``, or a negative one: ``-1`` is
    unlimited, ``-2`` until the context fills)."""
    limit = cell.flags.n_predict
    return limit is None or limit < 0

"""What to measure: for each batched cell of a deploy that no cert covers, everything one run
needs to produce the cert that covers it (``check-deploy --plan`` and ``--json``).

Built from the cell alone (:class:`~batch_invariance.gate.cells.DeployCell`), never
from a reader's internals: the server binary and the model as the deploy names them (where
they are here, with their sha256 where readable), ctx per slot and the whole pool, N, the KV
layout, every option that can change outputs as the engine's own words, the engine variables,
the answer length and the engine. Each entry is one ``include`` row of a GitHub Actions matrix
whose keys name ``cell.yml``'s inputs, and carries the ``run-live`` line that measures the same
cell off GitHub. ``cell.yml`` takes every input run-live does for a cell (the KV layout, the
engine variables, the prompt-cache arm with its ``--cache-ram``); a cell no measuring run can
cover (an option run-live sets itself or refuses, a cache its arm does not run, a unified pool
too small for 3/4 of it and a co-batched companion at once) says why in ``cell_yml_refuses``
and is left out of the matrix, so the gate fails on it naming the reason instead of measuring
a cert that cannot cover it. A unified cell is measured with ``kv-layout: unified``: its
length ladder adds long prompts past 3/4 of the pool (:mod:`batch_invariance.profiles.ladder`).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from batch_invariance.engines.llama_server.flags import flag_conflicts
from batch_invariance.engines.llama_server.options import (
    BY_CANONICAL,
    CELL_OPTIONS,
    NEUTRAL,
    OWNED,
    RUN_LIVE_SETS,
)
from batch_invariance.gate.cells import DeployCell
from batch_invariance.gate.prompt_cache import (
    CACHE_OPTIONS,
    PromptCacheUse,
    prompt_cache_use,
)
from batch_invariance.host.facts import sha256_file
from batch_invariance.profiles.ladder import pool_ladder_problem

__all__ = ["PlanEntry", "cell_plan", "matrix", "plan_entry", "server_words"]

#: The check kinds a measurement can turn into a pass: no valid cert measured the cell.
MEASURABLE_KINDS = frozenset({"missing"})


@dataclass(frozen=True)
class PlanEntry:
    """One cell to measure; the keys (with ``_`` as ``-``) are ``cell.yml``'s inputs."""

    #: Stable across runs and machines: the cell and a digest of what is measured.
    id: str
    #: The cell as check-deploy names it (``gemma ctx=1024 N=4 kv=split``).
    label: str
    #: Where the deploy starts it (``deploy.sh:3``).
    origin: str
    engine: str
    #: The binary where it is on this host, else as the deploy names it.
    server_bin: str
    server_bin_as_written: str
    server_bin_sha256: str | None
    model: str
    model_as_written: str
    model_sha256: str | None
    #: Context per slot (``cell.yml``'s ``ctx``) and the whole KV pool (``-c``).
    ctx: int
    ctx_total: int | None
    parallel: int
    kv_layout: str
    #: The measuring default, or the deploy's ``-n`` cap where it is longer: a cert covers a
    #: cap up to the length it measured, and a shorter budget than the default could never
    #: pass the length gate (an uncapped deploy's PASS is scoped to this length).
    n_predict: int
    #: Every output-changing option, one word per line (``cell.yml``'s ``server-flags``).
    server_flags: str
    #: ``NAME=VALUE`` per line: the variables the engine reads, as the deploy sets them.
    engine_env: str
    #: The prompt cache is on in the deploy: the cell must be measured with it.
    cache_arm: bool
    cache_ram: str | None
    #: The same cell off GitHub.
    run_live: str
    #: Why no measuring run, cell.yml's or run-live's, can take it as deployed (empty: cell.yml
    #: measures it; the entry is in the matrix).
    cell_yml_refuses: str


#: Where the deploy names the cell, not what is measured (left out of the id).
_WHERE = ("id", "label", "origin", "server_bin_as_written", "model_as_written")


def _sha256(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return sha256_file(path)
    except OSError:
        return None


def server_words(cell: DeployCell) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The deploy's output-changing options as llama-server words, and the owned ones a
    measuring run sets itself and cannot take (named for ``cell_yml_refuses``).

    Compared options only: the cell's own (model, ctx, N, KV layout, ``-n``), neutral ones
    and the prompt-cache options (the cache arm's) are carried elsewhere."""
    words: list[str] = []
    owned: list[str] = []
    for name in sorted(cell.flags.occurrences):
        if name in NEUTRAL or name in CELL_OPTIONS or name in RUN_LIVE_SETS:
            continue
        if name in CACHE_OPTIONS:
            continue
        values = cell.flags.occurrences[name]
        if name in OWNED:
            owned.append(f"{name} {values[-1]}")
            continue
        spec = BY_CANONICAL[name]
        for value in values:
            if spec.nvalues == 0:
                off = value == "off"
                if off and not spec.negatives:
                    continue
                words.append(next((n for n in spec.negatives if n.startswith("--")),
                                  spec.negatives[0]) if off else name)  # fmt: skip
            else:
                words += [name, *(value.split(" ") if spec.nvalues > 1 else [value])]
    return tuple(words), tuple(owned)


def _refusal(
    cell: DeployCell,
    words: tuple[str, ...],
    owned: Iterable[str],
    cache: PromptCacheUse,
    n_predict: int,
) -> str:
    """Why no measuring run, cell.yml's or run-live's, can cover the cell as the deploy runs
    it (empty: cell.yml measures it, its variables and prompt cache included)."""
    why = [f"{word} (run-live sets it itself)" for word in owned]
    if cell.layout.kv_unified and cell.pool is not None and cell.ctx is not None:
        # Any slot may fill a unified pool, so the gate needs sequences to 3/4 of the pool,
        # each co-batched with a companion while the KV in flight fits the pool.
        problem = pool_ladder_problem(cell.ctx, cell.parallel, n_predict)
        if problem is not None:
            why.append(f"a unified KV pool: {problem.split(';')[0]}")
    why += [f"{word} (run-live refuses it)" for word in flag_conflicts(words)]
    settings = dict(cache.settings)
    if cache.caches and not settings["--cache-ram"].isdigit():
        why.append(f"--cache-ram {settings['--cache-ram']} (the cache arm measures 0 MiB or more)")
    for name, off in (("--cache-reuse", "0"), ("--slot-save-path", "(none)")):
        if settings[name] != off:
            why.append(f"{name} {settings[name]} (the cache arm runs without it)")
    why += [f"engine variable {name} (its value holds a line break)"
            for name, value in sorted(cell.engine_env.items()) if "\n" in value]  # fmt: skip
    return "; ".join(why)


def _run_live(entry: PlanEntry) -> str:
    """The ``run-live`` line of the entry (its variables first, as a shell sets them)."""
    line = [
        "batch-invariance", "run-live", "--server-bin", entry.server_bin, "--model", entry.model,
        "--ctx", str(entry.ctx), "--parallel", str(entry.parallel),
        "--n-predict", str(entry.n_predict),
    ]  # fmt: skip
    if entry.kv_layout == "unified":
        line += ["--kv-layout", "unified"]
    if entry.cache_arm:
        line.append("--cache-arm")
        if entry.cache_ram is not None:
            line += ["--cache-ram", entry.cache_ram]
    line += [f"--server-flag={word}" for word in entry.server_flags.splitlines()]
    return shlex.join([*entry.engine_env.splitlines(), *line])


def _slug(text: str) -> str:
    out = "".join(c if c.isalnum() or c in "._-" else "_" for c in text).strip("._")
    return out or "model"


def plan_entry(cell: DeployCell, default_n_predict: int) -> PlanEntry:
    """The run that measures ``cell`` (which must have a context per slot)."""
    if cell.ctx is None:
        raise ValueError("a cell without a context per slot cannot be planned")
    words, owned = server_words(cell)
    cache = prompt_cache_use(cell.flags)
    limit = cell.flags.n_predict
    entry = PlanEntry(
        id="",
        label=cell.label,
        origin=cell.origin,
        engine="llama-server",
        server_bin=str(cell.binary_path or cell.binary),
        server_bin_as_written=cell.binary,
        server_bin_sha256=_sha256(cell.binary_path),
        model=str(cell.model_path or cell.model),
        model_as_written=cell.model,
        model_sha256=_sha256(cell.model_path),
        ctx=cell.ctx,
        ctx_total=cell.pool,
        parallel=cell.parallel,
        kv_layout=cell.layout_name,
        n_predict=max(limit, default_n_predict) if limit is not None else default_n_predict,
        server_flags="\n".join(words),
        engine_env="\n".join(f"{k}={v}" for k, v in sorted(cell.engine_env.items())),
        cache_arm=cache.caches,
        cache_ram=dict(cache.settings).get("--cache-ram") if cache.caches else None,
        run_live="",
        cell_yml_refuses="",
    )
    # The id names what is measured, not where the deploy says it: two servers of the same
    # cell are one entry, and the id is the same on every run of the gate.
    measured = {k: v for k, v in asdict(entry).items() if k not in _WHERE}
    digest = hashlib.sha256(json.dumps(measured, sort_keys=True).encode()).hexdigest()[:12]
    name = f"{_slug(cell.name)}__ctx{cell.ctx}__N{cell.parallel}__{cell.layout_name}__{digest}"
    refuses = _refusal(cell, words, owned, cache, entry.n_predict)
    return replace(entry, id=name, run_live=_run_live(entry), cell_yml_refuses=refuses)


def cell_plan(
    checks: Iterable[tuple[DeployCell, str]], default_n_predict: int
) -> tuple[PlanEntry, ...]:
    """One entry per distinct measurement among the (cell, check kind) pairs no cert covers
    (kind ``missing``); a cell that cannot be covered whatever is measured (an option in no
    class, an unknown context) or whose cert is invalid is not a measurement to plan."""
    seen: dict[str, PlanEntry] = {}
    for cell, kind in checks:
        if kind not in MEASURABLE_KINDS or cell.ctx is None or cell.not_covered:
            continue
        entry = plan_entry(cell, default_n_predict)
        seen.setdefault(entry.id, entry)
    return tuple(seen.values())


def matrix(entries: Iterable[PlanEntry]) -> dict[str, list[dict[str, object]]]:
    """The GitHub Actions matrix of the entries ``cell.yml`` can measure: ``{"include":
    [...]}`` (an empty ``include`` means nothing to measure; the caller skips the job)."""
    return {"include": [asdict(e) for e in entries if not e.cell_yml_refuses]}

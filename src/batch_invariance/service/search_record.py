"""``search.json`` and the engine command each configuration's cert measured.

The record is built from the rows the search read back from its written certs
(:func:`~batch_invariance.cert.verify.verify`), so it says what the cert files say; the
conclusion is the core's (:func:`~batch_invariance.core.search.answer`).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from batch_invariance.cert.verify import Depth, verify
from batch_invariance.core.search import (
    Interleaved,
    Round,
    SearchRow,
    answer,
    row_verdict,
    vs_default,
)
from batch_invariance.engines.registry import DEFAULT_ENGINE, ENGINES

__all__ = ["SEARCH_VERSION", "deploy_argv", "previous_interleaved", "search_record"]

SEARCH_VERSION = 1
#: argv words a deploy chooses for itself: where the server listens.
_OWN = frozenset({"--host", "--port"})


def deploy_argv(cert: Path) -> tuple[str, ...] | None:
    """The engine command that serves the cell ``cert`` measured: its concurrent server's
    argv as recorded, less where it listened, with the engine's prompt cache off (the cold
    arms measured without it). ``None`` where the cert records no such server."""
    v = verify(cert, Depth.FULL)
    if v.cert is None or v.cert.provenance.servers is None:
        return None
    prov = v.cert.provenance
    bc = [s for s in prov.servers or () if s.role == "BC"]
    if not bc or not bc[0].argv:
        return None
    argv = list(bc[0].argv)
    if prov.server_binary is not None and prov.server_binary.path:  # where its sha256 was read
        argv[0] = prov.server_binary.path
    out: list[str] = []
    skip = False
    for word in argv:
        if skip:
            skip = False
            continue
        if word in _OWN:
            skip = True
            continue
        out.append(word)
    # A cert that names no engine was written by llama-server's run-live, before engines.
    engine = ENGINES.get(prov.engine or DEFAULT_ENGINE)
    if engine is not None:
        out += _missing_options(engine.cache_off_advice.split(), out)
    return tuple(out)


def _missing_options(words: list[str], argv: list[str]) -> list[str]:
    """The options of ``words`` (a flag and the values after it) whose flag ``argv`` lacks."""
    groups: list[list[str]] = []
    for word in words:
        if word.startswith("-") or not groups:
            groups.append([word])
        else:
            groups[-1].append(word)
    return [w for g in groups if g[0] not in argv for w in g]


def _measured(m: Any) -> dict[str, Any] | None:
    return None if m is None else asdict(m)


def _interleaved(found: Interleaved | None, name: str) -> dict[str, Any] | None:
    if found is None:
        return None
    rounds = [
        {
            "order": [name, "defaults"] if r.config_first else ["defaults", name],
            "config_tokens_per_s": r.config_tps,
            "defaults_tokens_per_s": r.defaults_tps,
            "ratio": r.ratio,
        }
        for r in found.rounds
    ]
    return {"median_ratio": found.median, "rounds": rounds, "planned": found.planned,
            "key": found.key, "reused": found.reused, "stopped": found.stopped}  # fmt: skip


def previous_interleaved(path: Path) -> dict[str, Interleaved]:
    """The interleaved figures a search record at ``path`` holds, by configuration (none where
    there is no readable record: they are then measured again)."""
    try:
        rows = json.loads(path.read_text())["rows"]
        found = {}
        for row in rows:
            block = row.get("interleaved")
            if not block:
                continue
            rounds = tuple(
                Round(r["order"][0] != "defaults", r["config_tokens_per_s"],
                      r["defaults_tokens_per_s"])
                for r in block["rounds"]
            )  # fmt: skip
            found[str(row["config"])] = Interleaved(
                rounds, int(block["planned"]), str(block["key"]), stopped=block.get("stopped")
            )
        return found
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return {}


def search_record(
    model: str, ctx: int, parallel: int, engine: str, rows: list[SearchRow], *,
    stopped: str | None, wall_s: float,
) -> dict[str, Any]:  # fmt: skip
    """The ``search.json`` object."""
    defaults = next((r for r in rows if r.is_defaults), None)
    said = answer(rows)
    return {
        "search_version": SEARCH_VERSION,
        "model": model,
        "ctx": ctx,
        "parallel": parallel,
        "engine": engine,
        "wall_s": wall_s,
        "stopped": stopped,
        "fastest_green": said.fastest_green,
        "control_red": said.control_red,
        "best_amber": said.best_amber,
        "holds_longest": None if said.holds_longest is None else list(said.holds_longest),
        "answer": list(said.words),
        "rows": [
            {
                "config": r.name,
                "options": r.words,
                "defaults": r.is_defaults,
                "verdict": row_verdict(r),
                "vs_default": vs_default(r, defaults),
                "interleaved": _interleaved(r.interleaved, r.name),
                "probe": _measured(r.probe),
                "cert": _measured(r.cert),
                "not_run": r.not_run,
                "certs": r.certs,
                "deploy": None if r.deploy is None else list(r.deploy),
            }
            for r in rows
        ],
    }

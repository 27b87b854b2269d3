"""The search's table as text: one row per configuration, then the answer.

Read from the ``search.json`` record (:mod:`batch_invariance.service.search_record`), so the
table says what the written certs say. A row's verdict is its full cert's; a probe's RED or
AMBER is marked ``(probe)``, a probe too small for either that saw drift ``drift (probe)``; a
configuration the probe could not reject and no cert measured says so and is never GREEN.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from batch_invariance.core.throughput import n_buys_words

__all__ = ["search_text"]

_HEADER = ("config", "options", "verdict", "scope", "drift@", "N buys", "vs defaults", "from")


def _evidence(row: Mapping[str, Any]) -> Mapping[str, Any] | None:
    cert = row.get("cert")
    return cert if cert is not None else row.get("probe")


def _scope(seen: Mapping[str, Any] | None) -> str:
    if seen is None or seen.get("longest") is None:
        return "-"
    return f"{seen['longest']}/{seen.get('slot_ctx')}"


def _from(row: Mapping[str, Any]) -> str:
    cert, probe = row.get("cert"), row.get("probe")
    if cert is not None:
        return "cert (reused)" if cert.get("reused") else "cert"
    if probe is not None:
        return "probe (reused)" if probe.get("reused") else "probe"
    return str(row.get("not_run") or "not run")


def _ratio(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _vs_defaults(row: Mapping[str, Any]) -> str:
    """The interleaved median where it was measured, else the two certs' figure, marked."""
    if row.get("defaults"):
        return "-"
    block = row.get("interleaved") or {}
    median = block.get("median_ratio")
    if median is not None:
        done, planned = len(block.get("rounds") or ()), block.get("planned")
        return _ratio(median) + ("" if done == planned else f" ({done} of {planned} rounds)")
    value = row.get("vs_default")
    return "-" if value is None else f"{_ratio(value)} (not interleaved)"


def _cells(row: Mapping[str, Any]) -> tuple[str, ...]:
    seen = _evidence(row)
    cert = row.get("cert")
    drift = None if seen is None else seen.get("first_drift_position")
    buys = "-" if cert is None or cert.get("speedup") is None else _ratio(cert["speedup"])
    return (
        str(row["config"]),
        str(row["options"]),
        str(row["verdict"]),
        _scope(seen),
        "-" if drift is None else str(drift),
        buys,
        _vs_defaults(row),
        _from(row),
    )


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(_HEADER))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def search_text(record: Mapping[str, Any], path: str, deploy_line: str | None) -> str:
    """The table, what it concludes, the deploy line of the fastest promotable GREEN (where
    there is one) and where the record was written."""
    parallel = int(record["parallel"])
    head = (
        f"search: {record['model']} ctx={record['ctx']} N={parallel} engine {record['engine']}: "
        f"{len(record['rows'])} configuration(s), {record['wall_s']:.0f} s"
    )
    lines = [head, "", *_table([_HEADER, *(_cells(r) for r in record["rows"])]), ""]
    lines.append(
        "scope: longest sequence measured / slot; drift@: first sequence position where a "
        "co-batched logprob left the serial one; N buys: concurrent over serial tokens/s at "
        f"N={parallel}; vs defaults: concurrent tokens/s over the defaults' at the same N, "
        "the median of interleaved rounds (one server at a time, the order turned each round); "
        "not interleaved: the two certs' figures, measured one after the other"
    )
    lines.append("a probe can only reject: a configuration it did not reject needs its full cert")
    lines += list(record["answer"])
    fastest = record.get("fastest_green")
    if fastest is not None:
        row = next(r for r in record["rows"] if r["config"] == fastest)
        speedup = row["cert"]["speedup"]
        lines.append(f"{fastest}: GREEN: {n_buys_words('GREEN', parallel, speedup)}")
        if deploy_line is not None:
            lines.append(f"deploy it as: {deploy_line}")
    if record.get("stopped"):
        lines.append(f"stopped early: {record['stopped']}; run again to go on (certs are reused)")
    lines.append(f"search: {path}")
    return "\n".join(lines) + "\n"

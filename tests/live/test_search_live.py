"""Live search on the embedded default (Gemma 3 270M, CPU), kept small: two configurations
(the defaults and ``-fa off``) at ctx 512 per slot, N 2, on every third prompt of the length
ladder (11 prompts through every band, so the probe has prompts past 256). Every cert it
writes is run-live's own and verifies; the table has a row per configuration; a probe's
verdict is never a GREEN row; a second run measures nothing again. And a promotable GREEN
(``-ub 1`` at ctx 256) gets its interleaved comparison with the defaults."""

from __future__ import annotations

import json
from pathlib import Path

from batch_invariance import exitcodes
from batch_invariance.cert.verify import verify
from batch_invariance.cli import main
from batch_invariance.provision.embedded import Provisioned
from tests.support.fakes_live import LOOSE_GATES


def _ladder_subset(folder: Path) -> Path:
    full = folder / "ladder.json"
    assert main(["make-workset", "--ladder", "--ctx", "512", "--n-predict", "32",
                 "--out", str(full)]) == 0  # fmt: skip
    rows = json.loads(full.read_text())[::3]
    subset = folder / "ladder-subset.json"
    subset.write_text(json.dumps(rows))
    return subset


def _search(pair: Provisioned, out: Path, workset: Path) -> int:
    return main(["search", "--server-bin", str(pair.server_bin), "--model", str(pair.model),
                 "--workset", str(workset), "--ctx", "512", "--parallel", "2",
                 "--configs", "fa-off",
                 "--gate-passes", "2", "--reps", "1", "--n-predict", "32",
                 "--min-hot-trials", "1", "--no-serial-repeat", "--out-dir", str(out),
                 *LOOSE_GATES])  # fmt: skip


def test_a_two_configuration_search_certifies_through_run_live_and_reuses_its_certs(
    live_pair: Provisioned, tmp_path: Path
) -> None:
    out = tmp_path / "search"
    workset = _ladder_subset(tmp_path)
    code = _search(live_pair, out, workset)
    assert code in (exitcodes.PROMOTABLE, exitcodes.NOT_PROMOTABLE)
    record = json.loads((out / "search.json").read_text())
    rows = {r["config"]: r for r in record["rows"]}
    assert list(rows) == ["defaults", "fa-off"]
    assert rows["defaults"]["cert"] is not None  # the positive control always runs
    for row in rows.values():
        for kind in ("probe", "cert"):
            seen = row[kind]
            if seen is None:
                continue
            v = verify(Path(seen["path"]))
            assert v.problems == (), v.problems
            assert v.cert is not None and v.cert.source == "live"
            assert v.cert.provenance.driver == "search"
        if row["cert"] is None:
            assert "GREEN" not in row["verdict"]
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*.json") if p.name != "search.json"}
    assert _search(live_pair, out, workset) == code
    again = json.loads((out / "search.json").read_text())
    assert all(r[k] is None or r[k]["reused"] for r in again["rows"] for k in ("probe", "cert"))
    assert {p: p.stat().st_mtime_ns for p in before} == before
    print((out / "search.json").read_text())

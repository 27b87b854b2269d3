"""The per-prompt bound counts distinct request contents, not ids (issue 17 §1).

Forty ids that all send one prompt, or forty copies that differ only in whitespace, are one
distinct prompt: never GREEN. The count is re-derived from the request keys the cert carries,
so an edited count is caught, and duplicates are named when the work-set is read.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.cert.schema import compute_digest
from batch_invariance.cli import main
from batch_invariance.core.evidence import ItemMeta
from batch_invariance.core.plan import WorkItem, duplicate_prompts
from batch_invariance.core.sample import distinct_prompts
from batch_invariance.run.transport import RequestTemplate

PROMPT = "Write a short note about the sea."
CERT_NAME = "mock__ctx512__N4.json"


def _workset(path: Path, prompts: list[str]) -> Path:
    path.write_text(json.dumps([{"id": f"q{i}", "prompt": p} for i, p in enumerate(prompts)]))
    return path


#: Forty ids that carry one prompt: identical, or differing only in whitespace.
VARIANTS = {
    "identical": [PROMPT] * 40,
    "trailing-spaces": [PROMPT + " " * i for i in range(40)],
    "inner-whitespace": [
        PROMPT.replace(" ", " " * (1 + i % 3)) + "\n" * (i % 2) for i in range(40)
    ],
}


@dataclass(frozen=True)
class MockRun:
    workset: Path
    code: int
    out: str
    err: str
    cert: Path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, MockRun]:
    """run-mock on each variant's work-set, once for the module: the tests only read what it
    printed and wrote (the edited-count test edits a copy)."""
    done: dict[str, MockRun] = {}
    for name, prompts in VARIANTS.items():
        folder = tmp_path_factory.mktemp(name)
        workset = _workset(folder / "ws.json", prompts)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["run-mock", "--out-dir", str(folder / "out"), "--workset", str(workset)])
        done[name] = MockRun(workset, code, out.getvalue(), err.getvalue(),
                             folder / "out" / CERT_NAME)  # fmt: skip
    return done


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_one_prompt_under_forty_ids_is_not_green(runs: dict[str, MockRun], variant: str) -> None:
    run = runs[variant]
    assert run.code == exitcodes.NOT_PROMOTABLE
    assert "UNVERIFIED" in run.out and "GREEN" not in run.out.replace("UNVERIFIED", "")
    assert "per-prompt bound not met" in run.out
    assert "from 1 distinct co-batched prompt(s)" in run.out
    # Named when the work-set was read, and recorded.
    assert f"work-set {run.workset}: 40 rows carry only 1 distinct prompt(s)" in run.err
    data = json.loads(run.cert.read_text())
    assert data["status"] == "green_unverified"
    assert data["sensitivity"]["n_distinct_prompts"] == 1
    assert data["provenance"]["workset"]["duplicate_prompts"] == [[f"q{i}" for i in range(40)]]
    assert len({item["request_key"] for item in data["evidence"]["items"]}) == 1


def test_an_edited_distinct_count_is_caught_by_verify_cert(
    runs: dict[str, MockRun], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / CERT_NAME
    shutil.copyfile(runs["identical"].cert, path)
    assert main(["verify-cert", str(path)]) == exitcodes.NOT_PROMOTABLE
    data = json.loads(path.read_text())
    data["sensitivity"]["n_distinct_prompts"] = 40
    data["sensitivity"]["rate_upper_bound_95"] = 0.075
    data["digest"] = compute_digest(data)
    path.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["verify-cert", str(path)]) == exitcodes.CERT_INVALID
    assert "disagree with the verdict re-derived from its evidence: sensitivity" in (
        capsys.readouterr().err
    )


def test_what_makes_two_requests_distinct() -> None:
    item = WorkItem("a", PROMPT, None)
    same = WorkItem("b", "  " + PROMPT.replace(" ", "\t") + "\n", None)
    chat = WorkItem("c", None, (("user", PROMPT),))
    template = RequestTemplate(endpoint="completions", n_predict=64, seed=1)
    key = template.request_key(item)
    # Another id (so another seed) and other logprob fields: the same request.
    assert template.request_key(same) == key
    assert template.with_logprobs("none").request_key(item) == key
    # Another token budget, another endpoint, another body: distinct requests.
    assert RequestTemplate("completions", 65, 1).request_key(item) != key
    assert RequestTemplate("chat", 64, 1).request_key(item) != key
    assert template.request_key(chat) != key
    assert template.request_key(WorkItem("d", PROMPT + "!", None)) != key


def test_distinct_prompts_counts_keys_and_rows_without_keys() -> None:
    keyed = (ItemMeta("a", request_key="k1"), ItemMeta("b", request_key="k1"),
             ItemMeta("c", request_key="k2"))  # fmt: skip
    assert distinct_prompts(["a", "b", "c"], keyed) == 2
    assert distinct_prompts(["a", "b"], keyed) == 1
    # A cert written before request keys: ids count by work-set row (#rK folded).
    bare = (ItemMeta("x#r0"), ItemMeta("x#r1"), ItemMeta("y"))
    assert distinct_prompts(["x#r0", "x#r1", "y"], bare) == 2


def test_duplicate_prompts_names_groups_but_not_repetitions() -> None:
    items = [WorkItem("a", PROMPT, None), WorkItem("b", PROMPT + "  ", None),
             WorkItem("c", "other", None), WorkItem("d#r0", "rep", None),
             WorkItem("d#r1", "rep", None),
             WorkItem("e", None, (("user", PROMPT),))]  # fmt: skip
    assert duplicate_prompts(items) == (("a", "b"),)

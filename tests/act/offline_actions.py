"""actions/download-artifact at the commit the workflows pin, built for act from its sources.

The shared fixtures hold built copies of checkout and upload-artifact only, so the sources of
download-artifact live in tests/act/actions (tests/act/actions/PROVENANCE.md says what and
why). They are built here the way upstream's release script builds them (``npm ci``, then
``ncc build``) into the batch-invariance cache, once per content hash of the sources, so a
changed source is never served from an old build.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

from batch_invariance.cache_dir import cache_root

DOWNLOAD_ARTIFACT = "actions/download-artifact@d3f86a106a0bac45b974a628896c90dbdf5c8093"
SOURCES = Path(__file__).parent / "actions" / DOWNLOAD_ARTIFACT.split("/")[1]
_BUILD_TIMEOUT_S = 600


class ActionBuildError(RuntimeError):
    """The action could not be built (no npm, no registry, a failed build): the message says
    which command failed and its last output."""


def _content_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _step(argv: list[str], cwd: Path) -> None:
    try:
        done = subprocess.run(
            argv, cwd=cwd, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ActionBuildError(f"{' '.join(argv)}: {exc}") from exc
    if done.returncode:
        tail = (done.stdout + done.stderr)[-2000:]
        raise ActionBuildError(f"{' '.join(argv)} exited {done.returncode}: {tail}")


def built_download_artifact() -> Path:
    """The runnable folder (action.yml beside dist/index.js) for ``DOWNLOAD_ARTIFACT``."""
    target = cache_root() / "act-actions" / f"download-artifact-{_content_hash(SOURCES)}"
    if (target / "dist" / "index.js").is_file():
        return target
    if shutil.which("npm") is None:
        raise ActionBuildError("no npm on PATH: install Node.js 20 with npm (act runs node20)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as work:
        build = Path(work) / "src"
        shutil.copytree(SOURCES, build)
        _step(["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund"], build)
        _step(["npx", "--no-install", "ncc", "build", "src/download-artifact.ts",
               "-o", "dist"], build)  # fmt: skip
        shutil.rmtree(build / "node_modules")  # 353 MB that act never reads
        # A rename is atomic: a build interrupted halfway never looks finished.
        if not (target / "dist" / "index.js").is_file():
            shutil.rmtree(target, ignore_errors=True)
            build.rename(target)
    return target

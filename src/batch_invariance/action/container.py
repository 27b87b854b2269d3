"""The action image's entrypoint: preflight, the Action, then hand files back to their owner.

``python -m batch_invariance.action.container`` is what the Docker image runs. It

1. checks the mounted ``server-bin`` with ``ldd`` (:mod:`batch_invariance.action.preflight`)
   and stops with one ``::error::`` line when the image cannot run it;
2. runs the Action's entrypoint (:func:`~batch_invariance.action.entrypoint.main`), which
   reads INPUT_*;
3. gives every file it created in the workspace and in ``$HOME`` back to the owner of that
   folder (:mod:`batch_invariance.action.ownership`), whatever the outcome.

The exit code is the Action's (or the preflight's configuration-error code).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from batch_invariance import exitcodes
from batch_invariance.errors import BatchInvarianceError

_TITLE = "batch-invariance preflight: the server cannot run in this image (no run)"
#: File systems stamp times at tick granularity; look a little before the start.
_CLOCK_SLACK_NS = 2_000_000_000


def _server_bin(env: Mapping[str, str]) -> Path | None:
    """The server binary the inputs name (``None`` when none, or when the inputs are bad:
    the Action then names the bad input)."""
    from batch_invariance.action.inputs import read_inputs, server_bin_path

    try:
        return server_bin_path(read_inputs(env))
    except BatchInvarianceError:
        return None


def preflight(env: Mapping[str, str]) -> int | None:
    """None when the run may go ahead, else the exit code after reporting the problem."""
    from batch_invariance.action.preflight import check_binary
    from batch_invariance.report.render import annotation, failure_summary

    binary = _server_bin(env)
    if binary is None:
        return None
    try:
        check_binary(binary)
    except BatchInvarianceError as exc:
        print(annotation("error", _TITLE, str(exc)), flush=True)
        summary = env.get("GITHUB_STEP_SUMMARY")
        if summary:
            with contextlib.suppress(OSError), open(summary, "a", encoding="utf-8") as handle:
                handle.write(failure_summary(_TITLE, exc))
        return exitcodes.for_error(exc)
    return None


def give_back(env: Mapping[str, str], since_ns: int) -> None:
    """Hand the new root-owned files in the workspace, HOME and the cache to their owners."""
    from batch_invariance.action.ownership import hand_back
    from batch_invariance.report.render import annotation

    folders = {
        env.get("GITHUB_WORKSPACE") or os.getcwd(),
        env.get("HOME") or "",
        # The runner's tool cache, where the embedded default's build is kept between jobs.
        env.get("BATCH_INVARIANCE_CACHE") or "",
    }
    for folder in sorted(f for f in folders if f and Path(f).is_dir()):
        result = hand_back(Path(folder), since_ns)
        if result.error:
            message = f"files under {folder} may stay root-owned: {result.error}"
            print(annotation("warning", "batch-invariance file ownership", message), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    env = os.environ
    since = time.time_ns() - _CLOCK_SLACK_NS
    try:
        refused = preflight(env)
        if refused is not None:
            return refused
        from batch_invariance.action.entrypoint import main as action_main

        return action_main(list(argv or []))
    finally:
        give_back(env, since)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

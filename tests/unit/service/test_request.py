"""``LiveRequest.check``: every cheap check runs before any file, profile code or server is
touched, so each of these is refused with paths that do not exist."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from batch_invariance.core.plan import Measurement
from batch_invariance.errors import UsageError
from batch_invariance.service.options import LaunchOptions
from batch_invariance.service.request import AttachRequest, LiveRequest, ProfileRequest

NOWHERE = Path("/nonexistent/batch-invariance")
URL = "http://127.0.0.1:9"
BASE = LiveRequest(
    out_dir=NOWHERE / "out", server_bin=NOWHERE / "llama-server", model=NOWHERE / "m.gguf",
    workset=NOWHERE / "w.json", ctx=1024, parallel=4,
)  # fmt: skip


def test_a_well_formed_request_passes_the_cheap_checks_and_names_its_engine() -> None:
    assert BASE.check().engine.name == "llama-server"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"launch": LaunchOptions(cache_ram=1024)},
         "--cache-ram sets the prompt-cache arm's server"),
        ({"measurement": Measurement(cache_passes=1), "attach": AttachRequest(URL),
          "server_bin": None},
         "--cache-arm needs a server the tool launches"),
        ({"cache_shape": 2, "workset": None, "profile": ProfileRequest(name="spark")},
         "--cache-shape needs a --workset FILE"),
        ({"attach": AttachRequest(metrics_url=URL + "/metrics")},
         "--metrics-url goes with --base-url"),
        ({"attach": AttachRequest(URL), "server_bin": None, "server_flags": ("-ub", "1")},
         "--server-flag has no effect on an attached server"),
        ({"launch": LaunchOptions(kv_layout="unified"), "engine": "vllm"},
         "--kv-layout unified applies only to"),
        ({"ctx": 1000}, "--ctx 1000: llama-server rounds the context per slot up"),
        ({"server_flags": ("--parallel", "2")}, "--server-flag --parallel"),
        ({"profile": ProfileRequest(name="spark"), "engine": "vllm"},
         "--profile works only with the default engine"),
    ],
)  # fmt: skip
def test_each_cheap_problem_is_refused_before_anything_is_read(
    change: dict[str, object], message: str
) -> None:
    with pytest.raises(UsageError, match="^" + re.escape(message)):
        replace(BASE, **change).check()  # type: ignore[arg-type]

"""The systemd grammar against the real systemd (``systemd-analyze verify``, offline).

* The files: ``systemd-analyze verify --root`` loads a service's drop-ins and warns about an
  unknown key in each, in the order it applies them; the reader's list of drop-ins (which
  folders, which names mask which, the order) must be that list.
* The keys: every unit the grammar accepts is clean under ``systemd-analyze verify`` (no key
  systemd does not know, no value it refuses).

What systemd does with the values (``Environment=`` quoting, ``EnvironmentFile=`` parsing,
``ExecStart=`` splitting and ``$`` expansion) needs a running manager to show; those rules are
tested in test_config.py against systemd.exec(5) "Environment"/"EnvironmentFile" and
systemd.service(5) "Command lines".
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batch_invariance.deploy.readers.config import read_deploy_file
from batch_invariance.deploy.readers.systemd import KEYS, UNIT_DIRS, drop_in_files

ANALYZE = shutil.which("systemd-analyze")
pytestmark = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")


def _verify(*args: str) -> str:
    assert ANALYZE is not None
    done = subprocess.run([ANALYZE, "verify", "--man=no", *args], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    return done.stdout + done.stderr


def test_the_drop_ins_are_the_ones_systemd_loads_in_its_order(tmp_path: Path) -> None:
    root = tmp_path
    etc, run, usr = (root / d.relative_to("/") for d in (UNIT_DIRS[0], UNIT_DIRS[1], UNIT_DIRS[3]))
    unit = etc / "llm-chat.service"
    files = {
        etc / "llm-chat.service.d" / "20-a.conf": 1, usr / "llm-chat.service.d" / "20-a.conf": 2,
        usr / "llm-chat.service.d" / "10-b.conf": 3, run / "llm-chat.service.d" / "30-c.conf": 4,
        etc / "service.d" / "15-d.conf": 5, etc / "llm-.service.d" / "25-e.conf": 6,
        usr / "llm-.service.d" / "05-f.conf": 7, etc / "other.service.d" / "00-g.conf": 8,
        etc / "llm-chat.service.d" / "40-h.txt": 9,
    }  # fmt: skip
    unit.parent.mkdir(parents=True)
    unit.write_text("[Service]\nExecStart=/bin/sh\n")
    for path, number in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"[Service]\nBogus{number}=1\n")
    output = _verify(f"--root={root}", unit.name)
    loaded: list[str] = []
    for match in re.finditer(r"^(\S+\.conf):\d+: Unknown key 'Bogus\d+'", output, re.M):
        if match.group(1) not in loaded:
            loaded.append(match.group(1))
    assert loaded, output[:2000]
    assert len(loaded) == 6  # 20-a of /etc masks /usr/lib's; other.service.d, *.txt: not read
    assert [str(p) for p in drop_in_files(unit, root)] == loaded


SERVICE_VALUES = {
    "Type": ["simple", "exec"], "Group": ["llm"], "Restart": ["on-failure", "always"],
    "RestartSec": ["5"], "TimeoutStartSec": ["300"], "TimeoutStopSec": ["30"],
    "TimeoutSec": ["60"], "KillSignal": ["SIGTERM"], "KillMode": ["mixed"],
    "SuccessExitStatus": ["143"], "LimitNOFILE": ["65536"], "LimitMEMLOCK": ["infinity"],
    "StandardOutput": ["journal", "null"], "StandardError": ["journal", "inherit"],
    "SyslogIdentifier": ["llm"], "NoNewPrivileges": ["yes"], "PrivateTmp": ["true"],
    "ProtectSystem": ["full"], "ProtectHome": ["read-only"], "ProtectKernelTunables": ["yes"],
    "ProtectKernelModules": ["yes"], "ProtectControlGroups": ["yes"],
    "RestrictRealtime": ["yes"], "LockPersonality": ["yes"],
    "Environment": ["LLAMA_ARG_UBATCH=1", '"FLAGS=-c 4096 -np 4" X=1'],
    "UnsetEnvironment": ["LLAMA_ARG_UBATCH"], "WorkingDirectory": ["/srv"], "User": ["root"],
}  # fmt: skip
UNIT_VALUES = {
    "Description": ["llama-server"], "Documentation": ["https://example.com/llm"],
    "After": ["network-online.target"], "Wants": ["network-online.target"],
    "Requires": ["network-online.target"], "Before": ["multi-user.target"],
    "BindsTo": ["network-online.target"], "PartOf": ["multi-user.target"],
    "Conflicts": ["shutdown.target"], "StartLimitIntervalSec": ["60"], "StartLimitBurst": ["3"],
}  # fmt: skip
INSTALL_VALUES = {"WantedBy": ["multi-user.target"], "RequiredBy": ["multi-user.target"],
                  "Alias": ["llama.service"], "Also": ["network-online.target"]}  # fmt: skip


def test_every_key_of_the_grammar_is_exercised_here() -> None:
    assert set(SERVICE_VALUES) >= KEYS["Service"]
    assert set(UNIT_VALUES) == KEYS["Unit"] and set(INSTALL_VALUES) == KEYS["Install"]


@st.composite
def units(draw: st.DrawFn) -> str:
    def section(values: dict[str, list[str]]) -> str:
        keys = draw(st.lists(st.sampled_from(sorted(values)), unique=True, max_size=6))
        return "".join(f"{k}={draw(st.sampled_from(values[k]))}\n" for k in keys)

    return (
        f"[Unit]\n{section(UNIT_VALUES)}[Service]\n{section(SERVICE_VALUES)}"
        "Environment=M=/srv/m.gguf\nExecStart=/bin/sh -c true -m ${M}\n"
        f"[Install]\n{section(INSTALL_VALUES)}"
    )


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=units())
def test_units_the_grammar_accepts_are_clean_under_systemd(tmp_path: Path, text: str) -> None:
    unit = tmp_path / "llm.service"
    unit.write_text(text)
    read = read_deploy_file(unit)
    assert read.not_understood == (), read.unmodelled
    output = _verify(str(unit))
    complaints = [line for line in output.splitlines()
                  if (line.startswith(str(unit)) and "Unknown" in line) or "Failed to parse" in line
                  or "Invalid" in line]  # fmt: skip
    assert complaints == [], output

"""The llama-server option table, parsed from the real binary's ``--help``.

``python -m batch_invariance.engines.llama_server.help LLAMA_SERVER`` rewrites the committed
table (:mod:`~batch_invariance.engines.llama_server.option_table`) from a binary of the pinned
build;
``tests/live/test_server_options_live.py`` checks that the committed table equals what the
provisioned binary prints.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from batch_invariance.engines.llama_server.options import (
    TABLE_BUILD,
    OptionSpec,
    parse_help,
    table_module,
)
from batch_invariance.errors import InfraError


def help_text(server_bin: Path, timeout_s: float = 60.0) -> str:
    """What ``llama-server --help`` prints (it exits 0 without loading a model)."""
    try:
        done = subprocess.run(
            [str(server_bin), "--help"], capture_output=True, text=True, timeout=timeout_s,
            env={"PATH": "/usr/bin:/bin", "XDG_CONFIG_HOME": "/dev/null"},
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InfraError(f"cannot run {server_bin} --help: {exc}") from None
    if done.returncode != 0:
        raise InfraError(f"{server_bin} --help exited {done.returncode}: {done.stderr[-300:]}")
    return done.stdout


def options_of(server_bin: Path) -> tuple[OptionSpec, ...]:
    return parse_help(help_text(server_bin))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(
            "usage: python -m batch_invariance.engines.llama_server.help LLAMA_SERVER",
            file=sys.stderr,
        )
        return 2
    target = Path(__file__).resolve().with_name("option_table.py")
    target.write_text(table_module(options_of(Path(argv[0])), TABLE_BUILD), encoding="utf-8")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

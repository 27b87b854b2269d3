"""``python -m batch_invariance.commands.write_schema --write-schema docs/cert.schema.json``:
regenerate the cert JSON schema (:func:`batch_invariance.cert.store.write_schema`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from batch_invariance.cert.store import write_schema

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m batch_invariance.commands.write_schema")
    parser.add_argument(
        "--write-schema",
        metavar="PATH",
        type=Path,
        required=True,
        help="write the cert JSON schema here (docs/cert.schema.json)",
    )
    args = parser.parse_args(argv)
    write_schema(args.write_schema)
    print(f"wrote {args.write_schema}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

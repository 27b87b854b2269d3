"""`batch-invariance make-workset`: write the work-set a profile run would use.

Without ``--server-url`` prompts are fitted with the deterministic offline token estimate;
with it, with that running llama-server's ``/tokenize`` (what ``run-live --profile`` does on
its A server), so the file is byte-identical to what such a run sends.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from batch_invariance.cert.store import atomic_write_text
from batch_invariance.errors import UsageError
from batch_invariance.profiles.ladder import build_ladder
from batch_invariance.profiles.loader import load_profile
from batch_invariance.profiles.tokens import TokenCounter, approx_token_count, server_token_counter
from batch_invariance.run.workset import items_to_row


def register(sub: argparse._SubParsersAction[Any]) -> None:
    parser = sub.add_parser(
        "make-workset",
        help="write a profile's work-set to a file so it can be inspected",
        description=(
            "Generate the work-set a profile run would use (same seed, same bytes) and write "
            "it as a work-set JSON file."
        ),
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--profile", help="bundled profile name or folder path")
    source.add_argument(
        "--ladder",
        action="store_true",
        help="the length ladder the defaults measure (32 prompts filling the slot)",
    )
    parser.add_argument(
        "--n-predict",
        type=int,
        default=None,
        help="--ladder: the answer budget the sequences leave room for (default 128)",
    )
    parser.add_argument("--ctx", type=int, required=True, help="context size in tokens")
    parser.add_argument("--corner", default=None, help="fill corner (spark: balanced|short|long)")
    parser.add_argument("--seed", type=int, default=None, help="generator seed (default: 0)")
    parser.add_argument("--out", required=True, help="work-set JSON file to write")
    parser.add_argument(
        "--server-url",
        default=None,
        help="count tokens with this running llama-server's /tokenize (default: offline estimate)",
    )
    parser.set_defaults(func=run)


def render_rows(rows: list[dict[str, Any]]) -> bytes:
    """The file bytes: sorted keys, two-space indent, trailing newline (deterministic)."""
    return (json.dumps(rows, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def _write_atomic(path: Path, data: bytes) -> None:
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"--out {path}: folder {folder} does not exist")
    atomic_write_text(path, data.decode("utf-8"))


def run(args: argparse.Namespace) -> int:
    if args.ctx < 1:
        raise UsageError(f"--ctx must be a positive number of tokens (got {args.ctx})")
    out = Path(args.out)
    if out.is_dir():
        raise UsageError(f"--out {out} is a folder; give a file name")
    counter: TokenCounter = (
        server_token_counter(args.server_url) if args.server_url else approx_token_count
    )
    counted = f"server {args.server_url}" if args.server_url else "offline estimate"
    if args.ladder:
        return _write_ladder(args, out, counter, counted)
    if args.n_predict is not None:
        raise UsageError("--n-predict goes with --ladder (a profile sizes its own prompts)")
    profile = load_profile(args.profile)
    notes: list[str] = []
    workset = profile.workset(args.ctx, args.corner, args.seed, counter, notes)
    rows = [items_to_row(item) for item in workset.items]
    _write_atomic(out, render_rows(rows))
    corner = args.corner or profile.default_corner
    fills = sorted({item.fill for item in workset.items if item.fill is not None})
    families = sorted({item.family for item in workset.items if item.family is not None})
    print(
        f"wrote {len(rows)} items to {out} (profile {profile.name}, ctx {args.ctx}, corner "
        f"{corner}, families {' '.join(families)}, fills {' '.join(f'{f:g}' for f in fills)}; "
        f"tokens counted by {counted}; sha256 {workset.sha256})"
    )
    for note in notes:
        print(f"left out {note}", file=sys.stderr)
    return 0


def _write_ladder(args: argparse.Namespace, out: Path, counter: TokenCounter, counted: str) -> int:
    n_predict = 128 if args.n_predict is None else args.n_predict
    if n_predict < 1:
        raise UsageError(f"--n-predict must be at least 1 (got {n_predict})")
    if args.corner is not None:
        raise UsageError("--corner goes with --profile (the ladder has no corners)")
    seed = 0 if args.seed is None else args.seed
    items = build_ladder(args.ctx, n_predict, seed, counter)
    rows = [items_to_row(item) for item in items]
    _write_atomic(out, render_rows(rows))
    tokens = [int(i.meta["calibrated_tokens"]) for i in items]
    print(
        f"wrote {len(rows)} items to {out} (length ladder, ctx {args.ctx}, --n-predict "
        f"{n_predict}, seed {seed}; prompts {min(tokens)}-{max(tokens)} tokens counted by "
        f"{counted})"
    )
    return 0

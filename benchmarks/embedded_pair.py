"""The llama-server and model a benchmark runs: the ones named on its command line, the
embedded default's (provisioned, or reused from the cache) for whichever is not named."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NamedTuple

from batch_invariance.provision.embedded import provision


class Pair(NamedTuple):
    server_bin: Path
    model: Path


def add_pair_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--server-bin", type=Path, default=None, help="default: the embedded one")
    ap.add_argument("--model", type=Path, default=None, help="default: the embedded Gemma")


def pair_from(opts: argparse.Namespace) -> Pair:
    """``--server-bin`` and ``--model`` where given; the embedded default's otherwise."""
    if opts.server_bin is not None and opts.model is not None:
        return Pair(opts.server_bin, opts.model)
    embedded = provision()
    return Pair(opts.server_bin or embedded.server_bin, opts.model or embedded.model)

"""check-deploy reads a ``batch-invariance serve`` line with its own parser over
:data:`SERVE_OPTIONS`; serve parses its command line with argparse built from the same table.
Differential: on every option of the table, written every way, both accept the same lines
and read the same cert and neutral options."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from batch_invariance.commands.option_args import add_options
from batch_invariance.gate.serve_line import (
    SERVE_OPTIONS,
    ServeRefused,
    parse_serve_line,
    serve_target,
    split_neutral,
)

Read = tuple[Path | None, Path | None, tuple[str, ...]]


def _argparse(words: list[str]) -> Read | None:
    parser = argparse.ArgumentParser(prog="batch-invariance serve", add_help=False)
    add_options(parser, SERVE_OPTIONS)
    own, neutral = split_neutral(words)
    try:
        args = parser.parse_args(own)
        serve_target(args.cert, args.certs)  # what serve's handle checks first
    except (SystemExit, ServeRefused):
        return None
    return args.cert, args.certs, (*args.neutral, *(neutral or ()))


def _reader(words: list[str]) -> Read | None:
    try:
        line = parse_serve_line(["batch-invariance", "serve", *words], None, "deploy")
    except ServeRefused:
        return None
    return line.cert, line.certs, line.neutral


def _lines() -> list[list[str]]:
    lines: list[list[str]] = [[], ["c.json"], ["c.json", "x"], ["c.json", "--", "--port", "1"]]
    lines += [["--offline"], ["c.json", "--nope"], ["c.json", "--offline", "x"], ["-", "-5"]]
    for option in SERVE_OPTIONS:
        if not option.name.startswith("--"):
            continue
        short = option.name[: len(option.name) - 2]
        if option.kind == "flag":
            written = [[option.name], [short], [option.name + "=1"], [option.name, option.name]]
        else:
            written = [[option.name, "v"], [option.name + "=v"], [short, "v"], [option.name]]
            written += [[option.name, "--offline"], [option.name, "-5"], [option.name + "="]]
        for words in written:
            lines += [["c.json", *words], [*words, "c.json"], [*words, "c.json", "--", "--port"]]
            lines += [["c.json", *words, "n"], ["c.json", "n", *words]]
    lines += [["c.json", "--cert-identity", "a", "--cert-identity-regexp", "b"]]
    lines += [["c.json", "--cert", "a"], ["c.json", "--a"], ["c.json", "--cert-identity=a b"]]
    lines += [["--certs", "d", "--", "llama-server", "-np", "8"], ["--certs=d", "c.json"]]
    lines += [["--certs", "d", "--allow-unsigned", "--", "x"], ["--cert", "d", "--", "x"]]
    return lines


@pytest.mark.parametrize("words", _lines(), ids=" ".join)
def test_the_deploy_reader_agrees_with_serves_argparse(words: list[str]) -> None:
    assert _reader(words) == _argparse(words)


def test_every_option_of_the_table_is_exercised() -> None:
    written = {w.split("=")[0] for line in _lines() for w in line}
    assert {o.name for o in SERVE_OPTIONS if o.name.startswith("--")} <= written

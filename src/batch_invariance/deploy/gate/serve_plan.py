"""What ``batch-invariance serve CERT`` runs: the measured B/C server argv, with only neutral
options added or replaced (one plan for the ``serve`` command and for check-deploy, which
reads a ``batch-invariance serve`` line as the server that line starts).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from batch_invariance.cert.option_table import POLICY_OPTIONS, Option
from batch_invariance.cert.provenance import Provenance
from batch_invariance.deploy.readers.commands import ServerCommand
from batch_invariance.engines.llama_server.env import ServedEnv, served_env
from batch_invariance.engines.llama_server.flags import FlagError, read_flags
from batch_invariance.engines.llama_server.options import NEUTRAL, lookup
from batch_invariance.errors import UsageError


class ServeRefused(UsageError):
    """``serve`` will not start this: the message names what (nothing was started)."""


#: ``serve``'s command line as data: argparse is built from it in ``commands/serve.py``, and
#: :func:`parse_serve_line` reads a serve line of a deploy file from it.
SERVE_OPTIONS: tuple[Option, ...] = (
    Option("cert", "positional", "the promotable cert to serve", "CERT"),
    Option("--bundle", "path", "its sigstore bundle (default: CERT.sigstore.json beside it)", "B"),
    *POLICY_OPTIONS,
    Option("neutral", "rest", "after --: neutral llama-server options to add or replace "
           "(--host, --port, --api-key, --metrics, --timeout ...)", "-- NEUTRAL"),
)  # fmt: skip


def split_neutral(words: Sequence[str]) -> tuple[list[str], list[str] | None]:
    """``serve``'s own words and the llama-server options after its ``--`` (argparse cannot
    give a trailing positional list after a positional CERT and options)."""
    if "--" not in words:
        return list(words), None
    cut = list(words).index("--")
    return list(words[:cut]), list(words[cut + 1 :])


def measured_argv(provenance: Provenance) -> tuple[str, ...]:
    """The argv of the B/C server a cert measured (``provenance.servers``, role ``BC``)."""
    server = provenance.bc_server()
    if server is not None and server.argv:
        return server.argv
    raise ServeRefused("the cert records no B/C server argv: nothing measured to serve")


def served_environment(parent: Mapping[str, str], provenance: Provenance) -> ServedEnv:
    """The environment ``serve`` gives the server of ``provenance`` when started from
    ``parent``: the neutral and GPU-selection variables of ``parent`` plus exactly the engine
    variables the cert recorded (llama-server's rule,
    :func:`batch_invariance.engines.llama_server.env.served_env`), with what it refuses."""
    return served_env(parent, recorded_engine_env(provenance))


def recorded_engine_env(provenance: Provenance) -> dict[str, str]:
    """The engine variables the cert's B/C server ran with (none recorded = none set)."""
    server = provenance.bc_server()
    info = server.info if server is not None else None
    return dict((info.engine_env if info is not None else None) or {})


def _canonicals(words: Sequence[str]) -> set[str]:
    try:
        flags = read_flags(words, first_is_binary=False)
    except FlagError as exc:
        raise ServeRefused(f"extra option: {exc}") from None
    if flags.rejected:
        raise ServeRefused(f"extra option {flags.rejected[0]}: llama-server has no such option")
    for option in flags.options:
        if option.canonical not in NEUTRAL:
            raise ServeRefused(
                f"extra option {option.written} is not neutral (it can change outputs or the "
                "cell); only these may be added: " + ", ".join(sorted(NEUTRAL))
            )
    return {o.canonical for o in flags.options}


def serve_argv(measured: Sequence[str], neutral: Sequence[str]) -> tuple[str, ...]:
    """The measured argv with every option named in ``neutral`` replaced by the given one."""
    replaced = _canonicals(neutral)
    out = [measured[0]]
    index = 1
    while index < len(measured):
        spec = lookup(measured[index])
        width = 1 + (spec.nvalues if spec is not None else 0)
        if spec is None or spec.canonical not in replaced:
            out.extend(measured[index : index + width])
        index += width
    return (*out, *neutral)


def descriptor_argv(argv: Sequence[str], model_fd_path: str) -> tuple[str, ...]:
    """The argv ``serve`` execs once the model is open: every ``--model`` value replaced by
    the descriptor path (llama-server opens that, the inode that was hashed), and, unless an
    alias is given, ``--alias`` with the measured model path, so the name the API reports
    (``/v1/models``, ``model_alias``) stays the measured server's (a path with a comma cannot
    be one alias: llama-server splits aliases on commas; it then reports the descriptor path).
    """
    out = [argv[0]]
    model: str | None = None
    aliased = False
    index = 1
    while index < len(argv):
        spec = lookup(argv[index])
        width = 1 + (spec.nvalues if spec is not None else 0)
        words = list(argv[index : index + width])
        if spec is not None and spec.canonical == "--model" and len(words) == 2:
            model = words[1]
            words[1] = model_fd_path
        aliased = aliased or (spec is not None and spec.canonical == "--alias")
        out.extend(words)
        index += width
    if model is None:
        raise ServeRefused("the served argv names no --model: nothing to hand over")
    if not aliased and "," not in model:
        out.extend(("--alias", model))
    return tuple(out)


@dataclass(frozen=True)
class ServeLine:
    cert: Path
    neutral: tuple[str, ...]


def parse_serve_line(argv: Sequence[str], base_dir: Path | None, origin: str) -> ServeLine:
    """A ``batch-invariance serve ...`` command line as ``serve`` itself parses it (its
    argparse parser, built from :data:`SERVE_OPTIONS`, accepts exactly what this does)."""
    own, neutral = split_neutral(argv[2:])
    words = _read_words(own, SERVE_OPTIONS)
    if words is None:
        raise ServeRefused(f"{origin}: serve would refuse this command line")
    cert = Path(words[0])
    cert = cert if cert.is_absolute() or base_dir is None else base_dir / cert
    return ServeLine(cert, (*words[1:], *(neutral or ())))


_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def _option_like(word: str) -> bool:
    """What argparse reads as an option, not a value (no option here looks like a number)."""
    return (
        word.startswith("-")
        and word != "-"
        and not _NEGATIVE_NUMBER.match(word)
        and (" " not in word or word.split("=", 1)[0].startswith("--"))
    )


def _named(word: str, table: Sequence[Option]) -> Option | None:
    """The option ``word`` (before any ``=``) names, exactly or as a unique prefix."""
    flags = [o for o in table if o.name.startswith("--")]
    exact = [o for o in flags if o.name == word]
    prefixed = [o for o in flags if o.name.startswith(word)]
    found = exact or prefixed
    return found[0] if len(found) == 1 else None


def _read_words(words: Sequence[str], table: Sequence[Option]) -> list[str] | None:
    """The positional words of ``words`` read by ``table`` as argparse reads them (options
    anywhere, ``--flag=value``, unique prefixes, one group member at most, the positionals in
    one run), or ``None`` where argparse would refuse the line."""
    positionals: list[str] = []
    runs, seen, index = 0, set[str](), 0
    while index < len(words):
        word = words[index]
        if not _option_like(word):
            run_end = index
            while run_end < len(words) and not _option_like(words[run_end]):
                run_end += 1
            runs += 1
            if runs > 1:  # a second run: the positionals were already consumed
                return None
            positionals.extend(words[index:run_end])
            index = run_end
            continue
        name, eq, _ = word.partition("=")
        option = _named(name, table)
        if option is None or (option.kind == "flag" and eq):
            return None
        if option.kind != "flag" and not eq:
            index += 1
            if index >= len(words) or _option_like(words[index]):
                return None
        group = [o.name for o in table if o.group is not None and o.group == option.group]
        if any(other in seen and other != option.name for other in group):
            return None
        seen.add(option.name)
        index += 1
    return positionals or None


@dataclass(frozen=True)
class Served:
    """The llama-server a ``batch-invariance serve CERT`` line execs, and what in the line's
    environment serve would refuse or what reaches the Python that runs it."""

    command: ServerCommand
    problems: tuple[str, ...]


def served_command(command: ServerCommand) -> Served:
    """The server a serve line execs, in the environment serve gives it (:func:`served_env`)."""
    from batch_invariance.deploy.gate.prompt_cache import serving_argv
    from batch_invariance.engines.llama_server.env import (
        is_neutral_variable,
        is_option_variable,
    )

    line = parse_serve_line(command.argv, command.base_dir, command.origin)
    try:
        data = json.loads(line.cert.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ServeRefused(f"{command.origin}: cannot read cert {line.cert}: {exc}") from None
    record = data.get("provenance") if isinstance(data, Mapping) else None
    try:
        provenance = Provenance.from_record(record if isinstance(record, Mapping) else {})
    except ValueError:
        raise ServeRefused(
            f"{command.origin}: cert {line.cert}: its provenance does not match the cert schema"
        ) from None
    try:
        argv = serve_argv(serving_argv(provenance, measured_argv(provenance)), line.neutral)
    except ServeRefused as exc:
        raise ServeRefused(f"{command.origin}: {exc}") from None
    recorded = recorded_engine_env(provenance)
    served = served_env(command.env, recorded)
    problems = [f"serve would refuse environment {r}" for r in served.refused]
    problems += [
        f"environment {name} reaches the Python that runs serve (only neutral variables, "
        "LLAMA_ARG_* and the ones the cert recorded may be set; remove it)"
        for name in sorted(command.env)
        if not (is_neutral_variable(name) or is_option_variable(name) or name in recorded)
    ]
    served_command = ServerCommand(
        origin=command.origin, argv=argv, env=served.env, base_dir=command.base_dir,
        search_path=command.search_path,
    )  # fmt: skip
    return Served(served_command, tuple(problems))

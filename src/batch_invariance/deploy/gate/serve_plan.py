"""What ``batch-invariance serve CERT`` runs: the measured B/C server argv, with only neutral
options added or replaced (one plan for the ``serve`` command and for check-deploy, which
reads a ``batch-invariance serve`` line as the server that line starts).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
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
    Option("cert", "positional", "the promotable cert to serve (or --certs)", "CERT"),
    Option("--certs", "path", "a folder of certs: serve the engine command after -- with the "
           "cert in it that measured exactly that command (instead of CERT)", "DIR"),
    Option("--bundle", "path", "its sigstore bundle (default: CERT.sigstore.json beside it)", "B"),
    *POLICY_OPTIONS,
    Option("neutral", "rest", "after --: with CERT, neutral llama-server options to add or "
           "replace (--host, --port, --api-key, --metrics, --timeout ...); with --certs, the "
           "engine's own command (-- llama-server -m MODEL -c 4096 -np 4 -ub 1 ...)",
           "-- WORDS"),
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
    """A serve command line: the pinned ``cert`` with its neutral options, or the ``certs``
    folder with the engine command after ``--``; ``options``: serve's own options as given."""

    cert: Path | None
    neutral: tuple[str, ...]
    certs: Path | None = None
    options: tuple[tuple[str, str], ...] = ()


def serve_target(cert: Path | None, certs: Path | None) -> None:
    """Exactly one of CERT and ``--certs`` names what to serve (argparse cannot say so for an
    optional positional)."""
    if (cert is None) == (certs is None):
        raise ServeRefused(
            "serve takes either CERT (one pinned cert, neutral options after --) or --certs DIR "
            "(the engine command after --, served with the cert in DIR that measured it)"
        )


def parse_serve_line(argv: Sequence[str], base_dir: Path | None, origin: str) -> ServeLine:
    """A ``batch-invariance serve ...`` command line as ``serve`` itself parses it (its
    argparse parser, built from :data:`SERVE_OPTIONS`, accepts exactly what this does)."""
    own, tail = split_neutral(argv[2:])
    read = _read_words(own, SERVE_OPTIONS)
    if read is None:
        raise ServeRefused(f"{origin}: serve would refuse this command line")
    positionals, options = read

    def located(word: str) -> Path:
        path = Path(word)
        return path if path.is_absolute() or base_dir is None else base_dir / path

    certs = options.get("--certs")
    cert = located(positionals[0]) if positionals else None
    try:
        serve_target(cert, None if certs is None else located(certs))
    except ServeRefused as exc:
        raise ServeRefused(f"{origin}: {exc}") from None
    return ServeLine(
        cert, (*positionals[1:], *(tail or ())), None if certs is None else located(certs),
        tuple(sorted(options.items())),
    )  # fmt: skip


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


def _read_words(
    words: Sequence[str], table: Sequence[Option]
) -> tuple[list[str], dict[str, str]] | None:
    """The positional words of ``words`` and each option's value (``""`` for a flag) read by
    ``table`` as argparse reads them (options anywhere, ``--flag=value``, unique prefixes, one
    group member at most, the positionals in one run), or ``None`` where argparse would refuse
    the line."""
    positionals: list[str] = []
    values: dict[str, str] = {}
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
        name, eq, value = word.partition("=")
        option = _named(name, table)
        if option is None or (option.kind == "flag" and eq):
            return None
        if option.kind != "flag" and not eq:
            index += 1
            if index >= len(words) or _option_like(words[index]):
                return None
            value = words[index]
        values[option.name] = value
        group = [o.name for o in table if o.group is not None and o.group == option.group]
        if any(other in seen and other != option.name for other in group):
            return None
        seen.add(option.name)
        index += 1
    return positionals, values


@dataclass(frozen=True)
class Served:
    """The llama-server a ``batch-invariance serve`` line execs, what in the line's
    environment serve would refuse or what reaches the Python that runs it, and the line."""

    command: ServerCommand
    problems: tuple[str, ...]
    line: ServeLine


def engine_env_of(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment ``serve --certs`` gives the engine before it knows the cert: the
    neutral, GPU-selection and engine variables of ``environ`` (an engine variable must then
    be one the matched cert recorded), never ``LLAMA_ARG_*``, and no user config folder."""
    from batch_invariance.core.gpu_placement import is_gpu_selection
    from batch_invariance.engines.llama_server.env import (
        NO_USER_CONFIG,
        is_engine_variable,
        is_neutral_variable,
    )

    env = {
        name: value
        for name, value in environ.items()
        if is_neutral_variable(name) or is_gpu_selection(name) or is_engine_variable(name)
    }
    env["XDG_CONFIG_HOME"] = NO_USER_CONFIG
    return env


def engine_words(line: ServeLine, origin: str) -> tuple[str, ...]:
    """The engine command of a ``serve --certs`` line (program first)."""
    if not line.neutral or line.neutral[0].startswith("-"):
        raise ServeRefused(
            f"{origin}: serve --certs DIR: after -- write the engine's own command, program "
            "first (for example: -- llama-server -m MODEL -c 4096 -np 4 -ub 1)"
        )
    return line.neutral


def _pinned_cert_argv(line: ServeLine, origin: str) -> tuple[Provenance, tuple[str, ...]]:
    """The provenance of a ``serve CERT`` line's cert and the argv serve execs from it."""
    from batch_invariance.deploy.gate.prompt_cache import serving_argv

    assert line.cert is not None
    try:
        data = json.loads(line.cert.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ServeRefused(f"{origin}: cannot read cert {line.cert}: {exc}") from None
    record = data.get("provenance") if isinstance(data, Mapping) else None
    try:
        provenance = Provenance.from_record(record if isinstance(record, Mapping) else {})
    except ValueError:
        raise ServeRefused(
            f"{origin}: cert {line.cert}: its provenance does not match the cert schema"
        ) from None
    try:
        argv = serve_argv(serving_argv(provenance, measured_argv(provenance)), line.neutral)
    except ServeRefused as exc:
        raise ServeRefused(f"{origin}: {exc}") from None
    return provenance, argv


def served_command(command: ServerCommand) -> Served:
    """The server a serve line execs, in the environment serve gives it (:func:`served_env`):
    a ``--certs`` line's engine command as written, a ``CERT`` line's measured argv."""
    from batch_invariance.core.gpu_placement import is_gpu_selection
    from batch_invariance.engines.llama_server.env import (
        is_engine_variable,
        is_neutral_variable,
        is_option_variable,
    )

    line = parse_serve_line(command.argv, command.base_dir, command.origin)
    if line.certs is not None:
        argv = engine_words(line, command.origin)
        env, refused = engine_env_of(command.env), tuple[str, ...]()
        allowed = {name for name in command.env if is_engine_variable(name)}
    else:
        provenance, argv = _pinned_cert_argv(line, command.origin)
        allowed = set(recorded_engine_env(provenance))
        served = served_env(command.env, recorded_engine_env(provenance))
        env, refused = served.env, served.refused
    problems = [f"serve would refuse environment {r}" for r in refused]
    problems += [
        f"environment {name} reaches the Python that runs serve (only neutral variables, "
        "LLAMA_ARG_* and the ones the cert recorded may be set; remove it)"
        for name in sorted(command.env)
        # The dynamic loader reads LD_* for serve's own Python before serve checks anything.
        if name.startswith("LD_")
        or not (
            is_neutral_variable(name)
            or is_option_variable(name)
            or is_gpu_selection(name)
            or name in allowed
        )
    ]
    # In a container the engine is found, and its files mapped, as the container's own.
    return Served(replace(command, argv=tuple(argv), env=env), tuple(problems), line)

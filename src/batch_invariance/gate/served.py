"""What a ``batch-invariance serve`` line execs: the measured B/C server argv of its cert,
with only neutral options added or replaced (``serve CERT``), or the engine command after its
``--`` (``serve --certs``), in the environment serve gives it. The ``serve`` command runs this
argv; check-deploy reads a serve line as this server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from batch_invariance.cert.provenance import Provenance
from batch_invariance.core.gpu_placement import is_gpu_selection
from batch_invariance.engines.llama_server.env import (
    NO_USER_CONFIG,
    is_engine_variable,
    is_neutral_variable,
    is_option_variable,
    served_env,
)
from batch_invariance.engines.llama_server.flags import FlagError, read_flags
from batch_invariance.engines.llama_server.options import NEUTRAL, OptionSpec, lookup
from batch_invariance.gate.prompt_cache import serving_argv
from batch_invariance.gate.serve_line import ServeLine, ServeRefused, parse_serve_line
from batch_invariance.gate.server_command import ServerCommand


def measured_argv(provenance: Provenance) -> tuple[str, ...]:
    """The argv of the B/C server a cert measured (``provenance.servers``, role ``BC``)."""
    server = provenance.bc_server()
    if server is not None and server.argv:
        return server.argv
    raise ServeRefused("the cert records no B/C server argv: nothing measured to serve")


def recorded_engine_env(provenance: Provenance) -> dict[str, str]:
    """The engine variables the cert's B/C server ran with (none recorded = none set)."""
    server = provenance.bc_server()
    info = server.info if server is not None else None
    return dict((info.engine_env if info is not None else None) or {})


def option_spans(argv: Sequence[str]) -> Iterator[tuple[int, OptionSpec | None, int]]:
    """(index, the option llama-server reads there or ``None``, how many words it takes) of
    each option of an engine argv, ``argv[0]`` (the program) left out."""
    index = 1
    while index < len(argv):
        spec = lookup(argv[index])
        width = 1 + (spec.nvalues if spec is not None else 0)
        yield index, spec, width
        index += width


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
    for index, spec, width in option_spans(measured):
        if spec is None or spec.canonical not in replaced:
            out.extend(measured[index : index + width])
    return (*out, *neutral)


def served_argv(provenance: Provenance, neutral: Sequence[str]) -> tuple[str, ...]:
    """The argv serve execs for the cert of ``provenance``: its measured B/C argv as served
    (the prompt cache as measured: :func:`~batch_invariance.gate.prompt_cache.serving_argv`)
    with the options named in ``neutral`` added or replaced."""
    return serve_argv(serving_argv(provenance, measured_argv(provenance)), neutral)


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
        argv = served_argv(provenance, line.neutral)
    except ServeRefused as exc:
        raise ServeRefused(f"{origin}: {exc}") from None
    return provenance, argv


def served_command(command: ServerCommand) -> Served:
    """The server a serve line execs, in the environment serve gives it (:func:`served_env`):
    a ``--certs`` line's engine command as written, a ``CERT`` line's measured argv."""
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

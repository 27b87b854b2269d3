"""`batch-invariance serve`: the deploy contract. Start a server only where a promotable cert
measured exactly the cell it runs, proven on the serving host at start.

Two forms. ``serve --certs DIR -- llama-server -m M -c 4096 -np 4 -ub 1 ...`` states the cell
as the engine's own command (raising ``--parallel`` stays a one-word change): serve reads it
as check-deploy reads a server (:mod:`batch_invariance.serve.command_cert`), pins the
binary and the model it names (opened once, hashed through the descriptor), and finds the cert
in DIR that measured that cell with those bytes in that environment. ``serve CERT [-- NEUTRAL]``
pins one cert and runs its measured argv at the paths it measured.

Either way, before anything starts: the cert is read from a file and folders only you and
root can change, verified, promotable and signed under the identity policy (unless
``--allow-unsigned``); only neutral options are added; a split GGUF is refused (its other
files are opened by name, unpinned); llama.cpp's libraries beside the binary must be the ones
the cert recorded, by sha256; files the cert does not fingerprint (grammar, LoRA,
chat template files ...) are refused; a ``--log-file`` may not be, or lie inside, anything the
server reads; variables ggml reads must have the recorded values. Then serve leaves the
caller's folder (``/``: llama.cpp also loads backend libraries from the working folder) and
replaces itself (``execve`` of ``/proc/self/fd/N``) with the measured argv, the model given as
``/proc/self/fd/M``, in the environment a measured server gets (no user config folder: the
process *is* the server, running the bytes that were hashed). Refusals: exit 2 (an option,
the command line, a file or folder others could write), 3 (no promotable cert measured it, or
a file differs from what was measured), 5 (the cert or its signature is invalid). The table
of what is proven: docs/deploy.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batch_invariance.cert.provenance import Provenance
from batch_invariance.commands.cert_paths import cert_file, certs_folder
from batch_invariance.errors import CertInvalid, InfraError, NotCovered, UsageError

if TYPE_CHECKING:
    from batch_invariance.cert.signature import BundlePolicy
    from batch_invariance.serve.pinned_files import ServedFiles


def register(sub: argparse._SubParsersAction[Any]) -> None:
    from batch_invariance.commands.option_args import add_options
    from batch_invariance.gate.serve_line import SERVE_OPTIONS

    parser = sub.add_parser(
        "serve",
        help="start a llama-server only where a promotable cert measured exactly its cell",
        description=(
            "serve --certs DIR -- llama-server ARGS...: find the promotable, signed cert in DIR "
            "that measured exactly this command (binary and model by sha256, ctx, N, every "
            "output-changing option and variable) and exec it; serve CERT [-- NEUTRAL]: exec "
            "that cert's measured server with neutral options only (--host, --port, --api-key, "
            "--metrics, --timeout ...). See docs/deploy.md."
        ),
    )
    add_options(parser, SERVE_OPTIONS)
    parser.set_defaults(func=handle)


@dataclass(frozen=True)
class _Plan:
    """What serve execs: the cert that measured it, the argv, and the pinned files."""

    cert: Path
    provenance: Provenance
    argv: tuple[str, ...]
    files: ServedFiles


def _verify(cert_path: Path, bundle: Path | None, policy: BundlePolicy | None) -> Provenance:
    """The cert's provenance once it is valid, promotable and (unless allowed) signed, read
    from a file and folders only you and root can change (a cert others could swap after
    this check would decide what the next start runs)."""
    from batch_invariance.cert.signature import verify_bundle
    from batch_invariance.cert.signing import bundle_path_for
    from batch_invariance.gate.certs import read_cert_file
    from batch_invariance.gate.sequence_scope import sequence_problem
    from batch_invariance.serve.pinned_files import refuse_changeable

    refuse_changeable("cert", str(cert_path))
    cert = read_cert_file(cert_path)
    if isinstance(cert, str):
        raise CertInvalid(f"cannot serve {cert}")
    if cert.problem is not None:
        raise CertInvalid(f"cert {cert_path} is invalid: {cert.problem}")
    short = sequence_problem(cert.sequence_scope, cert.ctx)
    if not cert.promotable:
        # Name the lengths too where they fall short: the reason a user can act on.
        also = "" if short is None else f"; nor does it cover its slot: {short}"
        raise NotCovered(f"cert {cert_path} is not promotable ({cert.not_promotable}){also}")
    if short is not None:
        raise NotCovered(f"cert {cert_path} does not cover its slot: {short}")
    if policy is not None:
        bundle = bundle or bundle_path_for(cert_path)
        if not bundle.is_file():
            raise CertInvalid(f"cert {cert_path} is not signed (no {bundle}); pass --bundle")
        refuse_changeable("sigstore bundle", str(bundle))
        verify_bundle(cert_path, bundle, policy.signer, policy.trust)
    return cert.provenance


def _pinned_cert(args: argparse.Namespace, policy: BundlePolicy | None) -> _Plan:
    """``serve CERT [-- NEUTRAL]``: the cert's measured argv, at the paths it measured."""
    from batch_invariance.gate.served import served_argv
    from batch_invariance.serve.pinned_files import pin_served_files

    cert = cert_file(args.cert)
    provenance = _verify(cert, args.bundle, policy)
    argv = served_argv(provenance, args.neutral)
    return _Plan(cert, provenance, argv, pin_served_files(argv, provenance))


def _command_cert(args: argparse.Namespace, policy: BundlePolicy | None) -> _Plan:
    """``serve --certs DIR -- ENGINE ...``: the cert in DIR that measured exactly this engine
    command, with these files (by content) in this environment; its measured argv runs, with
    the command's neutral options and the command's own files."""
    from batch_invariance.gate.served import served_argv
    from batch_invariance.serve.command_cert import command_cell, engine_command, find_cert
    from batch_invariance.serve.pinned_files import (
        pin_files,
        refuse_split_model,
        refuse_unpinned_reads,
        require_measured,
    )

    if args.bundle is not None:
        raise UsageError("--bundle names one cert's bundle: with --certs each cert's is beside it")
    certs = certs_folder(args.certs, "--certs")
    command = engine_command(args.neutral, os.environ, Path.cwd())
    cell = command_cell(command)
    assert cell.binary_path is not None and cell.model_path is not None  # command_cell's rule
    files = pin_files(str(cell.binary_path), str(cell.model_path))
    try:
        found = find_cert(cell, certs, files, policy, command.argv)
        refuse_split_model(files.model)
        provenance = _verify(found.cert, None, policy)
        argv = served_argv(provenance, found.neutral)
        refuse_unpinned_reads(argv)
        require_measured(files, provenance)
    except BaseException:
        files.close()
        raise
    return _Plan(found.cert, provenance, argv, files)


def handle(args: argparse.Namespace) -> int:
    from batch_invariance.cert.signing_policy import signing_policy
    from batch_invariance.core.gpu_placement import placement_differences
    from batch_invariance.engines.registry import default_engine
    from batch_invariance.gate.serve_line import ServeRefused, serve_target
    from batch_invariance.host.facts import cpu_flags
    from batch_invariance.host.gpus import placement_here
    from batch_invariance.serve.cpu_variant import cpu_variant_problem
    from batch_invariance.serve.exec_argv import (
        absolute_paths,
        served_environment,
        write_problem,
    )
    from batch_invariance.servers.spawn import refuse_system_config

    serve_target(args.cert, args.certs)
    policy = signing_policy(args, "serve")
    refuse_system_config(default_engine())
    plan = (_command_cert if args.certs is not None else _pinned_cert)(args, policy)
    try:
        served = served_environment(os.environ, plan.provenance)
        if served.refused:
            raise NotCovered(
                f"environment {served.refused[0]}: the engine reads it, so the server would not "
                "be the measured one"
            )
        placed = placement_differences(plan.provenance.gpus, placement_here(served.env))
        if placed.differences:
            raise NotCovered(f"{placed.differences[0]}: not the hardware the cert measured")
        variant = cpu_variant_problem(plan.files.libraries, plan.provenance.host, cpu_flags())
        if variant is not None:
            raise NotCovered(variant)
        # serve leaves the caller's folder (llama.cpp looks for backend libraries in the
        # working folder too): paths given relative to it are made absolute first.
        argv = absolute_paths(plan.argv, Path.cwd())
        reads = (plan.files.binary.resolved, plan.files.model.resolved, str(plan.cert))
        problem = write_problem(argv, reads, (os.path.dirname(plan.files.binary.resolved),))
        if problem is not None:
            raise ServeRefused(problem)
        os.chdir("/")
        _exec(plan, argv, served.env, placed.unchecked)
    finally:
        plan.files.close()  # reached only when the exec failed (or a test stood in for it)
    return 0


def _exec(plan: _Plan, argv: tuple[str, ...], env: dict[str, str], unchecked: str | None) -> None:
    """Replace this process with the server: the binary exec'd from its descriptor, the model
    handed over as its descriptor path, both descriptors open across the exec (the binary's
    too: a ``#!`` script is read by its interpreter through that path after the exec)."""
    from batch_invariance.serve.exec_argv import descriptor_argv

    files = plan.files
    served_argv = descriptor_argv(argv, files.model.fd_path)
    for pinned in files.pinned:
        os.set_inheritable(pinned.fd, True)
    # Not the argv itself: it may hold an --api-key.
    cache = (
        "prompt cache on, as measured"
        if plan.provenance.cache_server() is not None
        else "prompt cache off (--no-cache-prompt): the cert measured cache-off traffic only"
    )
    also = f"; {unchecked}" if unchecked else ""
    print(
        f"batch-invariance serve: {plan.cert.name} verified; exec {argv[0]} from "
        f"{files.binary.fd_path} (sha256 {files.binary.sha256[:12]}...), model "
        f"{files.model.path} as {files.model.fd_path} (sha256 {files.model.sha256[:12]}...); "
        f"{cache}{also}",
        file=sys.stderr,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(files.binary.fd_path, list(served_argv), env)
    except OSError as exc:
        raise InfraError(f"cannot exec {argv[0]}: {exc.strerror or exc}") from None

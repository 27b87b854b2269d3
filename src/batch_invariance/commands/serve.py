"""`batch-invariance serve CERT [-- NEUTRAL...]`: start exactly the server a cert measured.

Before anything starts it verifies the cert (valid, promotable, signed under the identity
policy unless ``--allow-unsigned``), refuses any extra option that is not neutral
(:mod:`batch_invariance.deploy.gate.serve_plan`) and any variable ggml reads with another
value than the recorded one, opens the server binary and the model file once and
checks the sha256 read through those descriptors against the cert's provenance
(:mod:`batch_invariance.deploy.gate.pinned_files`: files others could change are refused). Then it
replaces itself (``execve`` of ``/proc/self/fd/N``, the binary's descriptor) with the measured
B/C server argv, the model given as ``/proc/self/fd/M`` (its descriptor, open across the
exec), neutral options added or replaced, in the environment a measured server gets (the
neutral variables and exactly the engine variables the cert recorded; every other variable
dropped, no user config file): the process *is* the server, running the bytes that were
hashed, so signals and the exit status are the server's own. Refusals: exit 2 (an option, the
command line, or a file or folder others could write), 3 (not promotable, or a file differs
from what was measured), 5 (the cert or its signature is invalid). The rules: docs/deploy.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from batch_invariance.cert.provenance import Provenance
from batch_invariance.commands.cert_paths import cert_file
from batch_invariance.errors import CertInvalid, InfraError, NotCovered

if TYPE_CHECKING:
    from batch_invariance.deploy.gate.pinned_files import ServedFiles


def register(sub: argparse._SubParsersAction[Any]) -> None:
    from batch_invariance.commands.option_args import add_options
    from batch_invariance.deploy.gate.serve_plan import SERVE_OPTIONS

    parser = sub.add_parser(
        "serve",
        help="start exactly the llama-server a promotable cert measured (neutral options only)",
        description=(
            "Verify CERT (valid, promotable, signed), check the server binary's and model's "
            "sha256 against it, then exec the measured B/C server argv; options after -- "
            "may only be neutral ones (--host, --port, --api-key, --metrics, --timeout ...). "
            "See docs/deploy.md."
        ),
    )
    add_options(parser, SERVE_OPTIONS)
    parser.set_defaults(func=handle)


def _verify(args: argparse.Namespace) -> Provenance:
    """The cert's provenance once it is valid, promotable and (unless allowed) signed."""
    from batch_invariance.cert.signature import (
        verify_bundle,
    )
    from batch_invariance.cert.signing import (
        bundle_path_for,
    )
    from batch_invariance.cert.signing_policy import signing_policy
    from batch_invariance.deploy.gate.certs import read_cert_file
    from batch_invariance.deploy.gate.sequence_scope import sequence_problem

    policy = signing_policy(args)
    cert = read_cert_file(args.cert)
    if isinstance(cert, str):
        raise CertInvalid(f"cannot serve {cert}")
    if cert.problem is not None:
        raise CertInvalid(f"cert {args.cert} is invalid: {cert.problem}")
    short = sequence_problem(cert.sequence_scope, cert.ctx)
    if not cert.promotable:
        # Name the lengths too where they fall short: the reason a user can act on.
        also = "" if short is None else f"; nor does it cover its slot: {short}"
        raise NotCovered(f"cert {args.cert} is not promotable ({cert.not_promotable}){also}")
    if short is not None:
        raise NotCovered(f"cert {args.cert} does not cover its slot: {short}")
    if policy is not None:
        bundle = args.bundle or bundle_path_for(args.cert)
        if not bundle.is_file():
            raise CertInvalid(f"cert {args.cert} is not signed (no {bundle}); pass --bundle")
        verify_bundle(args.cert, bundle, policy.signer, policy.trust)
    return cert.provenance


def handle(args: argparse.Namespace) -> int:
    from batch_invariance.core.gpu_placement import placement_differences
    from batch_invariance.deploy.gate.pinned_files import pin_served_files
    from batch_invariance.deploy.gate.prompt_cache import serving_argv
    from batch_invariance.deploy.gate.serve_plan import (
        measured_argv,
        serve_argv,
        served_environment,
    )
    from batch_invariance.engines.registry import default_engine
    from batch_invariance.host.gpus import placement_here
    from batch_invariance.servers.spawn import refuse_system_config

    cert_file(args.cert)
    provenance = _verify(args)
    # The prompt cache as measured: the cache arm's server, else the cold server with it off.
    argv = serve_argv(serving_argv(provenance, measured_argv(provenance)), args.neutral)
    refuse_system_config(default_engine())
    served = served_environment(os.environ, provenance)
    if served.refused:
        raise NotCovered(
            f"environment {served.refused[0]}: the engine reads it, so the server would not be "
            "the measured one"
        )
    env = served.env
    placed = placement_differences(provenance.gpus, placement_here(env))
    if placed.differences:
        raise NotCovered(f"{placed.differences[0]}: not the hardware the cert measured")
    files = pin_served_files(argv, provenance)
    try:
        _exec(args, provenance, argv, files, env, placed.unchecked)
    finally:
        files.close()  # reached only when the exec failed (or a test stood in for it)
    return 0


def _exec(
    args: argparse.Namespace,
    provenance: Provenance,
    argv: tuple[str, ...],
    files: ServedFiles,
    env: dict[str, str],
    unchecked: str | None,
) -> None:
    """Replace this process with the server: the binary exec'd from its descriptor, the model
    handed over as its descriptor path, both descriptors open across the exec (the binary's
    too: a ``#!`` script is read by its interpreter through that path after the exec)."""
    from batch_invariance.deploy.gate.serve_plan import descriptor_argv

    served_argv = descriptor_argv(argv, files.model.fd_path)
    for pinned in files:
        os.set_inheritable(pinned.fd, True)
    # Not the argv itself: it may hold an --api-key.
    cache = (
        "prompt cache on, as measured"
        if provenance.cache_server() is not None
        else "prompt cache off (--no-cache-prompt): the cert measured cache-off traffic only"
    )
    also = f"; {unchecked}" if unchecked else ""
    print(
        f"batch-invariance serve: {args.cert.name} verified; exec {argv[0]} from "
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

"""`batch-invariance serve CERT [-- NEUTRAL...]`: start exactly the server a cert measured.

Before anything starts it verifies the cert (valid, promotable, signed under the identity
policy unless ``--allow-unsigned``), refuses any extra option that is not neutral
(:data:`batch_invariance.engines.llama_server.options.NEUTRAL`) and any variable ggml reads
with another value than the recorded one, opens the server binary and the model file once and
checks the sha256 read through those descriptors against the cert's provenance
(:mod:`batch_invariance.deploy.pinned_files`: files others could change are refused). Then it
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
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from batch_invariance.cert.provenance import Provenance
from batch_invariance.commands.cert_paths import cert_file
from batch_invariance.errors import CertInvalid, InfraError, NotCovered

if TYPE_CHECKING:
    from batch_invariance.deploy.pinned_files import PinnedFile


def register(sub: argparse._SubParsersAction[Any]) -> None:
    from batch_invariance.deploy.serve_plan import add_serve_arguments

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
    add_serve_arguments(parser)
    parser.set_defaults(func=handle)


#: Options whose value is a file the cert does not fingerprint: serve cannot check them.
_UNCHECKED_FILES = frozenset(
    {"--spec-draft-model", "--lora", "--lora-scaled", "--control-vector",
     "--control-vector-scaled", "--mmproj", "--grammar-file", "--json-schema-file",
     "--chat-template-file", "--lookup-cache-static", "--lookup-cache-dynamic"}
)  # fmt: skip


class ServedFiles(NamedTuple):
    """The binary and the model the argv runs, open and hashed through their descriptors."""

    binary: PinnedFile
    model: PinnedFile

    def close(self) -> None:
        for pinned in self:
            os.close(pinned.fd)


def pin_files(argv: Sequence[str], provenance: Provenance) -> ServedFiles:
    """Open the binary and model the argv runs, once, and require the bytes read through those
    descriptors to be the ones the cert measured (the descriptors are what later runs)."""
    from batch_invariance.deploy.pinned_files import pin
    from batch_invariance.engines.llama_server.flags import read_flags

    flags = read_flags(argv, first_is_binary=True)
    unchecked = sorted({o.written for o in flags.options if o.canonical in _UNCHECKED_FILES})
    if unchecked:
        raise NotCovered(f"the measured argv loads {', '.join(unchecked)}, whose files the "
                         "cert does not fingerprint; serve cannot check them")  # fmt: skip
    binary, model = provenance.server_binary, provenance.model_file
    wanted: list[tuple[str, str, str]] = []
    for what, path, sha256 in (
        ("server binary", argv[0], binary.sha256 if binary is not None else None),
        ("model", flags.model, model.sha256 if model is not None else None),
    ):
        if not sha256 or path is None:
            raise NotCovered(f"the cert records no {what} sha256: serve cannot check it")
        wanted.append((what, path, sha256))
    pinned: list[PinnedFile] = []
    try:
        for what, path, sha256 in wanted:
            # The binary's folders too: a build that links or loads libraries finds them there.
            found = pin(what, path, folders=what == "server binary")
            pinned.append(found)
            if found.sha256 != sha256:
                raise NotCovered(
                    f"{what} {path} has sha256 {found.sha256[:12]}..., the cert measured "
                    f"{sha256[:12]}...: not the measured cell"
                )
    except BaseException:
        for done in pinned:
            os.close(done.fd)
        raise
    return ServedFiles(*pinned)


def _verify(args: argparse.Namespace) -> Provenance:
    """The cert's provenance once it is valid, promotable and (unless allowed) signed."""
    from batch_invariance.cert.signature import (
        verify_bundle,
    )
    from batch_invariance.cert.signing import (
        bundle_path_for,
    )
    from batch_invariance.commands.check_deploy import signing_policy
    from batch_invariance.deploy.gate import read_cert_file
    from batch_invariance.deploy.sequence_scope import sequence_problem

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
    from batch_invariance.deploy.prompt_cache import serving_argv
    from batch_invariance.deploy.serve_plan import measured_argv, recorded_engine_env, serve_argv
    from batch_invariance.engines.llama_server.env import served_env
    from batch_invariance.engines.registry import default_engine
    from batch_invariance.host.gpus import placement_here
    from batch_invariance.servers.spawn import refuse_system_config

    cert_file(args.cert)
    provenance = _verify(args)
    # The prompt cache as measured: the cache arm's server, else the cold server with it off.
    argv = serve_argv(serving_argv(provenance, measured_argv(provenance)), args.neutral)
    refuse_system_config(default_engine())
    served = served_env(os.environ, recorded_engine_env(provenance))
    if served.refused:
        raise NotCovered(
            f"environment {served.refused[0]}: the engine reads it, so the server would not be "
            "the measured one"
        )
    env = served.env
    placed = placement_differences(provenance.gpus, placement_here(env))
    if placed.differences:
        raise NotCovered(f"{placed.differences[0]}: not the hardware the cert measured")
    files = pin_files(argv, provenance)
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
    from batch_invariance.deploy.serve_plan import descriptor_argv

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

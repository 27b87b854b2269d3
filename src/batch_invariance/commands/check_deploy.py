"""`batch-invariance check-deploy CONFIG --certs DIR`: the deploy gate.

Passes (exit 0) only when every server the deploy starts with ``parallel > 1`` is started by
``batch-invariance serve`` (a server started directly never passes: the output names the serve
line that would, ``--suggest`` prints only those lines) and its cell is covered by a cert in
DIR that measured exactly that cell (model identity, server build, ctx per slot, N, KV
layout, numerics flags, answer length), verifies, is promotable and carries a sigstore
bundle that verifies against the identity policy, source repository included
(``--allow-unsigned`` skips signatures, and says so). A deploy with no ``-n`` cap passes with
its scope on the PASS line: answers up to the longest length the cert measured.
Exit 3 when a cell is not covered, 5 when a covering cert or its signature is invalid.
In a GitHub job each problem is also an ``::error`` annotation on its file and line;
``--json`` prints the outcome as one object. The rules and the output: docs/deploy.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batch_invariance.cert.signing_policy import signing_policy
from batch_invariance.commands.cert_paths import certs_folder
from batch_invariance.commands.option_args import add_policy_arguments
from batch_invariance.commands.reply import add_json_option

if TYPE_CHECKING:
    from batch_invariance.cert.signature import BundlePolicy
    from batch_invariance.deploy.deploy_report import DeployReport
    from batch_invariance.deploy.outcome import DeployOutcome
    from batch_invariance.deploy.plan_cells import PlanEntry
    from batch_invariance.gate.certs import CertFile


def register(sub: argparse._SubParsersAction[Any]) -> None:
    parser = sub.add_parser(
        "check-deploy",
        help="pass only when every batched cell of a deploy config has a promotable cert",
        description=(
            "Read a deploy config (shell script, systemd unit, compose file or Kubernetes "
            "manifest), find how it starts batch-invariance serve, and pass only when the cell "
            "each serve line asks for with parallel > 1 has a promotable, signed cert in "
            "--certs that measured exactly that cell. See docs/deploy.md."
        ),
    )
    parser.add_argument("config", type=Path, metavar="CONFIG", help="deploy config file")
    parser.add_argument(
        "--certs", type=Path, required=True, metavar="DIR", help="certs (searched recursively)"
    )
    parser.add_argument(
        "--server-binary",
        type=Path,
        default=None,
        metavar="PATH",
        help=(
            "the llama-server binary the deploy runs, for deploy files that name none readable "
            "here (a container image, a bare name): its sha256 must be the build "
            "the cert measured"
        ),
    )
    parser.add_argument(
        "--serve-image",
        action="append",
        default=[],
        metavar="sha256:DIGEST",
        help=(
            "the digest of an image that runs batch-invariance serve (built from "
            "docker/serve.Dockerfile); a serve line in a container passes only in an image "
            "pinned to a digest named here (repeatable)"
        ),
    )
    parser.add_argument(
        "--suggest",
        action="store_true",
        help=(
            "print only the serve line of each server the deploy starts directly (the form "
            "that would pass: batch-invariance serve --certs DIR -- ENGINE ...)"
        ),
    )
    parser.add_argument(
        "--store",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help=(
            "a cert store (the batch-invariance-certs branch checked out): its certs count "
            "beside --certs only where they verify and are signed per the identity policy; "
            "any other file is ignored with a line naming it (repeatable)"
        ),
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help=(
            'print, as one JSON object usable as a GitHub Actions matrix ({"include": [...]}), '
            "the run that measures each batched cell no cert covers (the keys are cell.yml's "
            "inputs); exit 0 whatever the gate decides"
        ),
    )
    add_policy_arguments(parser)
    add_json_option(parser, "the decision, each cell and construct with its problems")
    parser.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> DeployOutcome | int:
    from batch_invariance.commands.deploy_output import (
        deploy_annotations,
        deploy_text,
        in_github_job,
    )
    from batch_invariance.deploy.deploy_report import check_cells, load_deploy_cells
    from batch_invariance.deploy.outcome import deploy_outcome
    from batch_invariance.deploy.serve_required import gate_report, serve_suggestion

    signing = signing_policy(args)
    certs = certs_folder(args.certs, "--certs")
    read = load_deploy_cells(args.config)
    report = check_cells(
        args.config,
        read.cells,
        certs,
        signing,
        unmodelled=read.unmodelled,
        server_binary=args.server_binary,
        store=_store(args.store, signing),
    )
    plan = _plan(report)
    if args.plan:
        return _print_plan(plan)
    report = gate_report(report, certs, signing, _serve_images(args.serve_image))
    outcome = replace(deploy_outcome(report, read.not_understood, certs), plan=plan)
    if args.suggest:
        sys.stdout.write(
            "".join(
                f"# {check.cell.origin}: {check.cell.label}\n"
                f"{serve_suggestion(check.cell.argv, certs, signing)}\n"
                for check in report.checks
                if check.cell.serve_options is None
            )
        )
        return outcome
    sys.stdout.write(deploy_text(outcome))
    if in_github_job(os.environ):
        workspace = os.environ.get("GITHUB_WORKSPACE")
        sys.stdout.write(deploy_annotations(outcome, workspace, os.getcwd()))
    return outcome


def _store(folders: list[Path], signing: BundlePolicy | None) -> tuple[CertFile, ...]:
    """The store certs the gate counts; each file ignored is named on stderr."""
    from batch_invariance.deploy.cert_store import read_store

    admitted: list[CertFile] = []
    for folder in folders:
        read = read_store(folder, signing)
        admitted += read.admitted
        for line in read.ignored:
            sys.stderr.write(f"check-deploy: store: ignored {line}\n")
    return tuple(admitted)


def _plan(report: DeployReport) -> tuple[PlanEntry, ...]:
    """What to measure: the cells no cert covers, as run-live and cell.yml take them (read
    from the coverage, before the launch rule: a direct launch's cell is measured the same)."""
    from batch_invariance.deploy.plan_cells import cell_plan
    from batch_invariance.service.request import ACTION_DEFAULTS

    pairs = ((check.cell, check.kind) for check in report.checks)
    return cell_plan(pairs, ACTION_DEFAULTS.measurement.n_predict)


def _print_plan(plan: tuple[PlanEntry, ...]) -> int:
    """The matrix on stdout; each cell no measuring run can take on stderr, with why."""
    import json

    from batch_invariance.deploy.plan_cells import matrix

    for entry in plan:
        if entry.cell_yml_refuses:
            sys.stderr.write(
                f"check-deploy: plan: {entry.label} [{entry.origin}] is not in the matrix: no "
                f"measuring run takes {entry.cell_yml_refuses}; change the deploy\n"
            )
    sys.stdout.write(json.dumps(matrix(plan), sort_keys=True) + "\n")
    return 0


def _serve_images(given: list[str]) -> frozenset[str]:
    """The ``--serve-image`` digests, each ``sha256:`` and 64 hex digits."""
    import re

    from batch_invariance.errors import UsageError

    for digest in given:
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise UsageError(
                f"--serve-image {digest[:80]}: give the image's digest, sha256:<64 hex> "
                "(docker inspect --format '{{index .RepoDigests 0}}' IMAGE)"
            )
    return frozenset(given)

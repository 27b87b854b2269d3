"""The GitHub Action's entrypoint: ``python -m batch_invariance.action``.

It reads the step's inputs from ``INPUT_*`` environment variables (the runner keeps the
hyphens of input names, ``INPUT_SERVER-BIN``; the underscore spelling ``INPUT_SERVER_BIN`` is
accepted too, for the native reusable workflow), runs the cell through the same CLI parser,
command handler, driver and core as ``batch-invariance run-live`` / ``run-mock``, then:

* writes the outputs to ``$GITHUB_OUTPUT`` (heredoc form, safe for any value);
* appends a Markdown job summary to ``$GITHUB_STEP_SUMMARY``;
* prints ``::error::`` / ``::notice::`` annotations;
* signs the cert with sigstore when ``sign`` is true;
* exits 0 only when the ``require`` check holds (``green``: :func:`cert_is_green`,
  ``promotable``: :func:`is_promotable`), so the job status is the verdict. A mock cert
  (``source=mock``) can never pass.

Infrastructure and configuration failures end with their own annotation and exit code and
no verdict outputs; a signing failure after a measured cell is its own failure too.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Literal, TextIO

from batch_invariance import exitcodes
from batch_invariance.cert.signing import BundleSigner, detect_token, sign_file
from batch_invariance.errors import BatchInvarianceError, Interrupted, UsageError

Mode = Literal["live", "mock"]
Require = Literal["green", "promotable"]

#: Inputs and their defaults, exactly as ``action.yml`` declares them.
INPUT_DEFAULTS: Mapping[str, str] = {
    "mode": "live",
    "server-bin": "",
    "model": "",
    "workset": "",
    "profile": "",
    "model-alias": "",
    "models-dir": "",
    "ctx": "2048",
    "parallel": "4",
    "gate-passes": "8",
    "reps": "3",
    "n-predict": "128",
    "server-flags": "",
    "scorer": "",
    "out-dir": "batch-invariance-certs",
    "sign": "true",
    "require": "green",
}

#: The outputs this entrypoint writes (``action.yml`` declares the same names).
OUTPUT_NAMES: tuple[str, ...] = (
    "status",
    "verdict",
    "promotable",
    "cert-path",
    "bundle-path",
    "divergent-ids",
    "cell",
    "cell-id",
)

_TITLE = "batch-invariance"
_MAX_DIVERGENT_ROWS = 10
_EXCERPT_CHARS = 80


@dataclass(frozen=True)
class ActionInputs:
    """The step's inputs, validated and typed."""

    mode: Mode
    server_bin: str
    model: str
    workset: str
    profile: str
    model_alias: str
    models_dir: str
    ctx: int
    parallel: int
    gate_passes: int
    reps: int
    n_predict: int
    server_flags: tuple[str, ...]
    scorer: str
    out_dir: Path
    sign: bool
    require: Require
    workspace: Path
    #: Inputs set to something other than their default (for "ignored in mock mode").
    explicit: frozenset[str] = field(default_factory=frozenset)


def input_value(env: Mapping[str, str], name: str) -> str | None:
    """The raw value of input ``name`` (hyphenated form first), or None when unset."""
    upper = name.upper()
    for key in (f"INPUT_{upper}", f"INPUT_{upper.replace('-', '_')}"):
        if key in env:
            return env[key]
    return None


def _int_input(name: str, raw: str, minimum: int) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise UsageError(f"input {name} must be an integer, got {raw.strip()!r}") from None
    if value < minimum:
        raise UsageError(f"input {name} must be at least {minimum}, got {value}")
    return value


def _bool_input(name: str, raw: str) -> bool:
    text = raw.strip().lower()
    if text in {"true", "1", "yes", "on"}:
        return True
    if text in {"false", "0", "no", "off", ""}:
        return False
    raise UsageError(f"input {name} must be true or false, got {raw.strip()!r}")


def read_inputs(env: Mapping[str, str]) -> ActionInputs:
    """Validate the step's inputs (pure over ``env``); UsageError names the bad input."""
    raw: dict[str, str] = {}
    explicit: set[str] = set()
    for name, default in INPUT_DEFAULTS.items():
        given = input_value(env, name)
        value = default if given is None or given.strip() == "" else given
        raw[name] = value
        if value.strip() != default:
            explicit.add(name)
    mode = raw["mode"].strip().lower()
    if mode not in ("live", "mock"):
        raise UsageError(f"input mode must be live or mock, got {raw['mode'].strip()!r}")
    require = raw["require"].strip().lower()
    if require not in ("green", "promotable"):
        raise UsageError(
            f"input require must be green or promotable, got {raw['require'].strip()!r}"
        )
    workspace = Path(env.get("GITHUB_WORKSPACE") or os.getcwd())
    out_dir = Path(raw["out-dir"].strip())
    if not out_dir.is_absolute():
        out_dir = workspace / out_dir
    flags = tuple(line.strip() for line in raw["server-flags"].splitlines() if line.strip())
    return ActionInputs(
        mode="live" if mode == "live" else "mock",
        server_bin=raw["server-bin"].strip(),
        model=raw["model"].strip(),
        workset=raw["workset"].strip(),
        profile=raw["profile"].strip(),
        model_alias=raw["model-alias"].strip(),
        models_dir=raw["models-dir"].strip(),
        ctx=_int_input("ctx", raw["ctx"], 1),
        parallel=_int_input("parallel", raw["parallel"], 1),
        gate_passes=_int_input("gate-passes", raw["gate-passes"], 1),
        reps=_int_input("reps", raw["reps"], 1),
        n_predict=_int_input("n-predict", raw["n-predict"], 1),
        server_flags=flags,
        scorer=raw["scorer"].strip(),
        out_dir=out_dir,
        sign=_bool_input("sign", raw["sign"]),
        require="green" if require == "green" else "promotable",
        workspace=workspace,
        explicit=frozenset(explicit),
    )


# --------------------------------------------------------------------------- workflow commands


def escape_data(text: str) -> str:
    """Escape a workflow-command message (``::error::MESSAGE``)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """Escape a workflow-command property value (``title=...``)."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(level: Literal["error", "warning", "notice"], title: str, message: str) -> str:
    return f"::{level} title={escape_property(title)}::{escape_data(message)}"


def format_outputs(values: Mapping[str, str]) -> str:
    """``$GITHUB_OUTPUT`` text in the heredoc form, with a delimiter no value contains."""
    chunks: list[str] = []
    for name, value in values.items():
        delimiter = f"ghadelimiter_{uuid.uuid4().hex}"
        while delimiter in value:  # pragma: no cover - a 128-bit collision
            delimiter = f"ghadelimiter_{uuid.uuid4().hex}"
        chunks.append(f"{name}<<{delimiter}\n{value}\n{delimiter}\n")
    return "".join(chunks)


def _append(path_value: str | None, text: str) -> None:
    """Append to a runner file-command file; a failure is an :class:`InfraError`."""
    if not path_value:
        return
    try:
        with open(path_value, "a", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as exc:
        from batch_invariance.errors import InfraError

        raise InfraError(
            f"cannot write the runner file {path_value}: {exc.strerror or exc}"
        ) from None


# --------------------------------------------------------------------------- running the cell


@dataclass(frozen=True)
class CellResult:
    """The cert a run wrote, read back."""

    path: Path
    cert: Any


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            choice = action.choices.get(command)
            if isinstance(choice, argparse.ArgumentParser):
                return choice
    raise UsageError(f"this batch-invariance has no {command} command")


def _abs(workspace: Path, value: str) -> str:
    path = Path(value)
    return str(path if path.is_absolute() else workspace / path)


def default_workset() -> Path:
    """The bundled work-set the demo runs (used when no workset or profile is given)."""
    from importlib import resources

    return Path(str(resources.files("batch_invariance") / "data" / "worksets" / "demo.json"))


@dataclass(frozen=True)
class CommandLine:
    command: str
    argv: tuple[str, ...]
    #: Inputs the command has no option for (mock mode ignores the server ones).
    ignored: tuple[str, ...]


def build_command(
    inputs: ActionInputs,
    accepted: frozenset[str],
    embedded: tuple[str, str] | None,
) -> CommandLine:
    """The CLI argv equivalent to the inputs (pure): only options ``accepted`` declares.

    ``embedded`` is the (server, model) pair of the embedded default when live mode was
    given neither. An explicit input the command cannot take is an error in live mode and
    ignored (reported) in mock mode.
    """
    command = "run-live" if inputs.mode == "live" else "run-mock"
    ws = inputs.workspace
    wanted: list[tuple[str, str, str]] = []  # (input, option, value)
    server_bin, model = inputs.server_bin, inputs.model
    if embedded is not None:
        server_bin, model = embedded
    if server_bin:
        wanted.append(("server-bin", "--server-bin", _abs(ws, server_bin)))
    if model:
        wanted.append(("model", "--model", _abs(ws, model)))
    if inputs.workset:
        wanted.append(("workset", "--workset", _abs(ws, inputs.workset)))
    elif inputs.mode == "live" and not inputs.profile:
        wanted.append(("workset", "--workset", str(default_workset())))
    for name, option, value in (
        ("profile", "--profile", inputs.profile),
        ("model-alias", "--model-alias", inputs.model_alias),
        ("models-dir", "--models-dir", inputs.models_dir),
        ("scorer", "--scorer", inputs.scorer),
    ):
        if value:
            wanted.append((name, option, value))
    for name, option, number in (
        ("ctx", "--ctx", inputs.ctx),
        ("parallel", "--parallel", inputs.parallel),
        ("gate-passes", "--gate-passes", inputs.gate_passes),
        ("reps", "--reps", inputs.reps),
        ("n-predict", "--n-predict", inputs.n_predict),
    ):
        # The mock's own defaults keep a wiring test fast; pass only what the step set.
        if inputs.mode == "live" or name in inputs.explicit:
            wanted.append((name, option, str(number)))
    wanted.append(("out-dir", "--out-dir", str(inputs.out_dir)))
    if inputs.mode == "live":
        wanted.append(("", "--cert-source", "live"))

    argv: list[str] = [command]
    ignored: list[str] = []
    for name, option, value in wanted:
        if option in accepted:
            # --opt=value: a value that starts with "-" stays a value, not an option.
            argv.append(f"{option}={value}")
        elif not name:
            continue  # a compatibility flag the command does not declare
        elif inputs.mode == "live":
            raise UsageError(f"input {name} is not supported by {command}")
        elif name in inputs.explicit:
            ignored.append(name)
    if inputs.server_flags:
        if "--server-flag" in accepted:
            # --opt=value keeps argparse from reading "-ngl" as an option of its own.
            argv += [f"--server-flag={flag}" for flag in inputs.server_flags]
        elif inputs.mode == "live":
            raise UsageError(f"input server-flags is not supported by {command}")
        else:
            ignored.append("server-flags")
    return CommandLine(command=command, argv=tuple(argv), ignored=tuple(ignored))


def _cert_files(folder: Path) -> dict[Path, tuple[int, int]]:
    if not folder.is_dir():
        return {}
    found: dict[Path, tuple[int, int]] = {}
    for path in folder.glob("*.json"):
        if path.name.endswith(".sigstore.json") or ".superseded-" in path.name:
            continue
        stat = path.stat()
        found[path] = (stat.st_mtime_ns, stat.st_ino)
    return found


def run_cell_via_cli(line: CommandLine) -> CellResult:
    """Run the command exactly as ``batch-invariance <argv>`` would, and read its cert."""
    from batch_invariance import cli
    from batch_invariance.cert.store import read_cert
    from batch_invariance.errors import InfraError

    parser = cli.build_parser()
    try:
        args = parser.parse_args(list(line.argv))
    except SystemExit:
        # argparse already printed its usage line; the step needs one clear error.
        raise UsageError(
            f"the inputs do not make a valid command line: batch-invariance {' '.join(line.argv)}"
        ) from None
    module = importlib.import_module(f"batch_invariance.commands.{line.command.replace('-', '_')}")
    execute = getattr(module, "execute", None)
    out_dir = Path(args.out_dir)
    if callable(execute):
        finished = execute(args)
        return CellResult(path=Path(finished.path), cert=finished.cert)
    before = _cert_files(out_dir)
    args.func(args)
    after = _cert_files(out_dir)
    fresh = [path for path, stamp in after.items() if before.get(path) != stamp]
    if not fresh:
        raise InfraError(f"{line.command} finished without writing a cert in {out_dir}")
    path = max(fresh, key=lambda p: after[p][0])
    return CellResult(path=path, cert=read_cert(path))


def embedded_default() -> tuple[str, str]:
    """Provision the embedded default (real llama-server + Gemma 3 270M) and return it."""
    from batch_invariance.engines.provision import provision

    got = provision()
    return str(got.server_bin), str(got.model)


# --------------------------------------------------------------------------- the report


def _cell_text(cert: Any) -> str:
    return f"{cert.model}/{cert.ctx}/{cert.dispatch_n}"


def relative_to_workspace(path: Path, workspace: Path) -> str:
    """``path`` relative to the workspace when inside it (what later host steps can use)."""
    try:
        return str(path.resolve().relative_to(workspace.resolve()))
    except ValueError:
        return str(path)


def _md(value: Any, limit: int = _EXCERPT_CHARS) -> str:
    text = " ".join(str(value).split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text.replace("|", "\\|").replace("`", "'") or "∅"


def outputs_for(cert: Any, cert_path: Path, bundle: Path | None, workspace: Path) -> dict[str, str]:
    from batch_invariance.cert.certificate import display_verdict, is_promotable

    return {
        "status": str(cert.status),
        "verdict": display_verdict(str(cert.status)),
        "promotable": "true" if is_promotable(cert) else "false",
        "cert-path": relative_to_workspace(cert_path, workspace),
        "bundle-path": relative_to_workspace(bundle, workspace) if bundle else "",
        "divergent-ids": str(len(cert.divergence_report.ac.divergent_ids)),
        "cell": _cell_text(cert),
        "cell-id": cert_path.stem,
    }


def require_holds(cert: Any, require: Require) -> bool:
    from batch_invariance.cert.certificate import cert_is_green, is_promotable

    return bool(cert_is_green(cert) if require == "green" else is_promotable(cert))


def summary_markdown(cert: Any, require: Require, passed: bool, outputs: Mapping[str, str]) -> str:
    """The job summary: verdict, gate table, divergent ids, bound, scope (pure)."""
    ac = cert.divergence_report.ac
    lines = [
        f"## batch-invariance: {outputs['verdict']} — `{outputs['cell']}`",
        "",
        f"- **Verdict:** {outputs['verdict']} (status `{cert.status}`, source `{cert.source}`, "
        f"gate `{cert.gate}`, KV `{cert.kv_label}`)",
        f"- **Require `{require}`:** {'met' if passed else 'NOT met'}; promotable: "
        f"{outputs['promotable']}",
    ]
    if cert.divergence_class:
        lines.append(f"- **Divergence class:** `{cert.divergence_class}`")
    if cert.anomaly:
        lines.append(f"- **Anomaly:** `{cert.anomaly}`")
    if cert.source == "mock":
        lines.append(
            "- **Mock run:** this cert comes from the in-process mock server "
            "(`source=mock`); it tests the wiring and can never pass `require`."
        )
    lines += ["", "### Gates", "", "| gate | result | reason |", "| --- | --- | --- |"]
    for name, outcome in cert.gates.items():
        mark = "pass" if outcome.ok else "**fail**"
        lines.append(f"| {name} | {mark} | {_md(outcome.reason, 200)} |")
    lines += ["", f"### Divergent ids (A vs C): {len(ac.divergent_ids)}", ""]
    rows = [row for row in ac.per_id if row.kind != "token_only"]
    if rows:
        lines += ["| id | pass | field | A | C |", "| --- | --- | --- | --- | --- |"]
        for row in rows[:_MAX_DIVERGENT_ROWS]:
            a_text = row.x_excerpt if row.x_excerpt is not None else row.x
            c_text = row.y_excerpt if row.y_excerpt is not None else row.y
            where = "" if row.pass_index is None else str(row.pass_index)
            lines.append(
                f"| `{_md(row.test_id, 60)}` | {where} | {row.field} | {_md(a_text)} | "
                f"{_md(c_text)} |"
            )
        if len(rows) > _MAX_DIVERGENT_ROWS:
            lines.append(f"\n…and {len(rows) - _MAX_DIVERGENT_ROWS} more rows in the cert.")
    else:
        lines.append("None: A and C agreed on every compared id and pass.")
    if ac.token_divergence_ids:
        lines.append(
            f"\nToken-only differences (same invariant fields): {len(ac.token_divergence_ids)} "
            "id(s)."
        )
    scope = cert.promotion_scope
    lines += [
        "",
        "### Sensitivity",
        "",
        _md(scope.rule_of_three, 400),
        "",
        "### Scope",
        "",
        f"> {_md(str(scope.valid_for).rstrip('.'), 400)}. This result does not generalize "
        "to other models, context sizes, N, builds or hardware.",
        f"> {_md(scope.moe_warning, 400)}",
        "",
        "### Decision reasons",
        "",
    ]
    lines += [f"{i}. {_md(reason, 400)}" for i, reason in enumerate(cert.decision_reasons, 1)]
    lines += ["", f"Cert: `{outputs['cert-path']}`"]
    if outputs["bundle-path"]:
        lines.append(f"Signature bundle: `{outputs['bundle-path']}`")
    return "\n".join(lines) + "\n"


def verdict_annotation(cert: Any, require: Require, passed: bool, cell: str) -> str:
    from batch_invariance.cert.certificate import display_verdict

    verdict = display_verdict(str(cert.status))
    title = f"{_TITLE} {verdict}"
    reasons = "; ".join(str(r) for r in cert.decision_reasons[:2])
    if passed:
        return annotation("notice", title, f"{cell}: {verdict}, require {require} met. {reasons}")
    if cert.status == "failed":
        n = len(cert.divergence_report.ac.divergent_ids)
        mock = " (mock run)" if cert.source == "mock" else ""
        return annotation(
            "error",
            title,
            f"{cell}: batching changed scored outputs on {n} id(s) "
            f"({cert.divergence_class}){mock}. {reasons}",
        )
    if cert.source == "mock":
        return annotation(
            "error",
            title,
            f"{cell}: mock mode: the cert has source=mock and can never pass require "
            f"{require}; use mode live on a real server",
        )
    return annotation(
        "error", title, f"{cell}: {verdict} does not meet require {require}. {reasons}"
    )


# --------------------------------------------------------------------------- main


def _failure_title(exc: BatchInvarianceError) -> str:
    from batch_invariance.errors import CertInvalid, GuardRefused, InfraError

    if isinstance(exc, InfraError):
        return f"{_TITLE} infrastructure failure (no verdict)"
    if isinstance(exc, GuardRefused):
        return f"{_TITLE} refused to launch (no verdict)"
    if isinstance(exc, CertInvalid):
        return f"{_TITLE} cert invalid"
    if isinstance(exc, Interrupted):
        return f"{_TITLE} interrupted (no verdict)"
    return f"{_TITLE} configuration error (no verdict)"


def _fail(
    exc: BatchInvarianceError, env: Mapping[str, str], out: TextIO, title: str | None = None
) -> int:
    heading = title or _failure_title(exc)
    print(annotation("error", heading, str(exc)), file=out)
    # Best effort: the annotation above already carries the error.
    with contextlib.suppress(BatchInvarianceError):
        _append(env.get("GITHUB_STEP_SUMMARY"), f"## {heading}\n\n{_md(exc, 1000)}\n")
    return exitcodes.for_error(exc)


def run_action(
    env: Mapping[str, str],
    *,
    signer: BundleSigner | None = None,
    out: TextIO | None = None,
    provisioner: Callable[[], tuple[str, str]] = embedded_default,
    accepted_options: Callable[[str], Iterable[str]] | None = None,
) -> int:
    """Run the Action against ``env`` and return the process exit code."""
    stream = out if out is not None else sys.stdout
    try:
        inputs = read_inputs(env)
        if inputs.sign:
            # Fail before a long GPU run when the job cannot sign anyway.
            try:
                detect_token(None)
            except BatchInvarianceError as exc:
                return _fail(exc, env, stream, title=f"{_TITLE} signing impossible (no run)")
        embedded: tuple[str, str] | None = None
        if inputs.mode == "live" and not inputs.profile:
            if bool(inputs.server_bin) != bool(inputs.model):
                raise UsageError(
                    "set both server-bin and model, or neither to run the embedded default"
                )
            if not inputs.server_bin:
                embedded = provisioner()
        command = "run-live" if inputs.mode == "live" else "run-mock"
        accepted = frozenset(
            accepted_options(command) if accepted_options else _accepted_options(command)
        )
        line = build_command(inputs, accepted, embedded)
        for name in line.ignored:
            print(
                annotation("notice", _TITLE, f"input {name} is ignored in mock mode"), file=stream
            )
        print(f"batch-invariance {' '.join(line.argv)}", file=stream, flush=True)
        result = run_cell_via_cli(line)
    except BatchInvarianceError as exc:
        return _fail(exc, env, stream)
    except KeyboardInterrupt:
        return _fail(Interrupted(int(signal.SIGINT)), env, stream)

    cert = result.cert
    bundle: Path | None = None
    sign_error: BatchInvarianceError | None = None
    if inputs.sign:
        try:
            token = detect_token(None)
            bundle = sign_file(result.path, token, signer).bundle
        except BatchInvarianceError as exc:
            sign_error = exc

    passed = require_holds(cert, inputs.require)
    outputs = outputs_for(cert, result.path, bundle, inputs.workspace)
    print(verdict_annotation(cert, inputs.require, passed, outputs["cell"]), file=stream)
    try:
        _append(env.get("GITHUB_OUTPUT"), format_outputs(outputs))
        _append(
            env.get("GITHUB_STEP_SUMMARY"),
            summary_markdown(cert, inputs.require, passed, outputs),
        )
    except BatchInvarianceError as exc:
        # The cert is written (and signed); only the report to the runner failed.
        return _fail(exc, env, stream)
    for name in OUTPUT_NAMES:
        print(f"{name}: {outputs[name]}", file=stream)
    if sign_error is not None:
        return _fail(
            sign_error, env, stream, title=f"{_TITLE} signing failed (cert kept, not signed)"
        )
    if passed:
        return exitcodes.PROMOTABLE
    return exitcodes.for_status(str(cert.status), promotable=False)


def _accepted_options(command: str) -> frozenset[str]:
    from batch_invariance import cli

    return frozenset(_subparser(cli.build_parser(), command)._option_string_actions)


def _raise_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Entrypoint of the Docker action and of the reusable workflow's step."""
    if argv:
        print("batch-invariance action takes its inputs from INPUT_* variables", file=sys.stderr)
        return exitcodes.USAGE
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    try:
        return run_action(os.environ)
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""The Action's inputs: ``INPUT_*`` -> :class:`ActionInputs` -> the cell request.

The runner keeps the hyphens of input names (``INPUT_SERVER-BIN``); the underscore spelling
(``INPUT_SERVER_BIN``) is accepted too, for the native reusable workflow. Numbers are checked
against the same table as the command line (:mod:`batch_invariance.core.plan`), and the
defaults come from the same table as ``run-live``'s (``action.yml`` states them too; a test
keeps it equal to :data:`INPUT_DEFAULTS`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, get_args

from batch_invariance.action.baseline import BaselineInputs, read_baseline_inputs
from batch_invariance.core.plan import Measurement, number_problems
from batch_invariance.engines.base import KvLayout
from batch_invariance.engines.registry import DEFAULT_ENGINE, ENGINES
from batch_invariance.errors import UsageError
from batch_invariance.profiles.ladder import LADDER
from batch_invariance.report.render import Require
from batch_invariance.service.endpoint import ENDPOINT_CHOICES, EndpointChoice
from batch_invariance.service.mock_cell import MOCK_MEASUREMENT, MockRequest
from batch_invariance.service.options import LaunchOptions
from batch_invariance.service.request import ACTION_DEFAULTS, LiveRequest, ProfileRequest

Mode = Literal["live", "mock"]
REQUIRES: tuple[Require, ...] = get_args(Require)


def _one_of(values: tuple[str, ...]) -> str:
    return f"{', '.join(values[:-1])} or {values[-1]}"


#: Inputs and their defaults (``action.yml`` declares the same).
INPUT_DEFAULTS: Mapping[str, str] = {
    "mode": "live",
    "engine": DEFAULT_ENGINE,
    "server-bin": "",
    "model": "",
    "workset": "",
    "profile": "",
    "model-alias": "",
    "models-dir": "",
    "server-dir": "",
    "ctx": str(ACTION_DEFAULTS.ctx),
    "parallel": str(ACTION_DEFAULTS.parallel),
    "gate-passes": str(ACTION_DEFAULTS.measurement.gate_passes),
    "reps": str(ACTION_DEFAULTS.measurement.reps),
    "n-predict": str(ACTION_DEFAULTS.measurement.n_predict),
    "endpoint": ACTION_DEFAULTS.endpoint,
    "server-flags": "",
    "kv-layout": "split",
    "engine-env": "",
    "cache-arm": "false",
    "cache-ram": "",
    "scorer": "",
    "out-dir": "batch-invariance-certs",
    "sign": "true",
    "require": "green",
    "baseline": "",
    "fail-on": "scored",
    "baseline-identity": "",
    "baseline-oidc-issuer": "https://token.actions.githubusercontent.com",
    "baseline-repository": "",
    "baseline-allow-unsigned": "false",
}

#: Inputs only a live cell takes (mock mode reports them as ignored).
LIVE_ONLY_INPUTS: tuple[str, ...] = (
    "engine", "server-bin", "model", "profile", "model-alias", "models-dir", "server-dir",
    "server-flags", "kv-layout", "engine-env", "cache-arm", "cache-ram",
)  # fmt: skip
_NUMBER_INPUTS: tuple[str, ...] = ("ctx", "parallel", "gate-passes", "reps", "n-predict")
#: Inputs that take one value per line; every other input is one line (a line break in it is
#: refused before it can reach a path, the job log or the summary).
MULTILINE_INPUTS: frozenset[str] = frozenset({"server-flags", "engine-env"})


@dataclass(frozen=True)
class ActionInputs:
    """The step's inputs, validated and typed."""

    mode: Mode
    #: ``--engine``: which server ``server-bin`` launches (one of ``engines.registry``).
    engine: str
    server_bin: str
    model: str
    workset: str
    profile: str
    model_alias: str
    #: A folder of models (the container mounts it read-only at :data:`MODELS_MOUNT`): a
    #: relative ``model`` is looked up in it, and a profile's ``{MODELS_DIR}`` is it.
    models_dir: str
    #: A folder holding a server build (mounted at :data:`SERVER_MOUNT`): a relative
    #: ``server-bin`` is looked up in it.
    server_dir: str
    ctx: int
    parallel: int
    gate_passes: int
    reps: int
    n_predict: int
    #: ``auto``, ``chat`` or ``completions`` (``auto``: decided with the CLI's rule,
    #: :func:`batch_invariance.service.endpoint.choose_endpoint`).
    endpoint: EndpointChoice
    server_flags: tuple[str, ...]
    scorer: str
    out_dir: Path
    sign: bool
    require: Require
    workspace: Path
    #: run-live's ``--kv-layout``, its variables (``NAME=VALUE``, set over the step's own, as
    #: a shell prefix sets them; only variables the engine reads), ``--cache-arm`` and
    #: ``--cache-ram``: what a deploy cell runs beyond its flags (``check-deploy --plan``).
    kv_layout: KvLayout = "split"
    engine_env: tuple[tuple[str, str], ...] = ()
    cache_arm: bool = False
    cache_ram: int | None = None
    #: ``baseline``, ``fail-on`` and the baseline's signature policy (docs/compare.md).
    baseline: BaselineInputs = field(default_factory=lambda: BaselineInputs("", "scored", None))
    #: Inputs set to something other than their default (for "ignored in mock mode").
    explicit: frozenset[str] = field(default_factory=frozenset)

    def ignored(self) -> tuple[str, ...]:
        """Explicit inputs the mode does not use (reported, not an error)."""
        if self.mode == "live":
            return ()
        return tuple(name for name in LIVE_ONLY_INPUTS if name in self.explicit)


def input_value(env: Mapping[str, str], name: str) -> str | None:
    """The raw value of input ``name`` (hyphenated form first), or None when unset."""
    upper = name.upper()
    for key in (f"INPUT_{upper}", f"INPUT_{upper.replace('-', '_')}"):
        if key in env:
            return env[key]
    return None


def _int_input(name: str, raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise UsageError(f"input {name} must be an integer, got {raw.strip()!r}") from None


def _bool_input(name: str, raw: str) -> bool:
    text = raw.strip().lower()
    if text in {"true", "1", "yes", "on"}:
        return True
    if text in {"false", "0", "no", "off", ""}:
        return False
    raise UsageError(f"input {name} must be true or false, got {raw.strip()!r}")


def _spell_input(field_name: str) -> str:
    return "input " + field_name.replace("_", "-")


def _cell_numbers(numbers: Mapping[str, int]) -> LiveRequest:
    """The numeric inputs as the request they become, for its rules to check."""
    measured = Measurement(
        gate_passes=numbers["gate_passes"], reps=numbers["reps"], n_predict=numbers["n_predict"]
    )
    return LiveRequest(None, ctx=numbers["ctx"], parallel=numbers["parallel"], measurement=measured)


def read_inputs(env: Mapping[str, str]) -> ActionInputs:
    """Validate the step's inputs (pure over ``env``); UsageError names the bad input. An
    input other than :data:`MULTILINE_INPUTS` holding a line break (after its surrounding
    whitespace, which is dropped) is refused."""
    raw: dict[str, str] = {}
    explicit: set[str] = set()
    for name, default in INPUT_DEFAULTS.items():
        given = input_value(env, name)
        value = default if given is None or given.strip() == "" else given
        if name not in MULTILINE_INPUTS and ("\n" in value.strip() or "\r" in value.strip()):
            raise UsageError(
                f"input {name} holds a line break; it takes one line (only server-flags takes "
                "one value per line, engine-env one variable per line)"
            )
        raw[name] = value
        if value.strip() != default:
            explicit.add(name)
    mode = raw["mode"].strip().lower()
    if mode not in ("live", "mock"):
        raise UsageError(f"input mode must be live or mock, got {raw['mode'].strip()!r}")
    engine = raw["engine"].strip().lower()
    if engine not in ENGINES:
        choices = ", ".join(sorted(ENGINES))
        raise UsageError(f"input engine must be one of {choices}, got {raw['engine'].strip()!r}")
    require = raw["require"].strip().lower()
    if require not in REQUIRES:
        raise UsageError(
            f"input require must be {_one_of(REQUIRES)}, got {raw['require'].strip()!r}"
        )
    numbers = {name.replace("-", "_"): _int_input(name, raw[name]) for name in _NUMBER_INPUTS}
    problems = number_problems(_cell_numbers(numbers), spell=_spell_input)
    if problems:
        raise UsageError(problems[0])
    baseline = read_baseline_inputs(raw, env)
    if require == "none" and not baseline.source:
        raise UsageError(
            "input require none leaves the job to the comparison with a baseline; set baseline, "
            f"or require {_one_of(tuple(r for r in REQUIRES if r != 'none'))}"
        )
    workspace = Path(env.get("GITHUB_WORKSPACE") or os.getcwd())
    out_dir = Path(raw["out-dir"].strip())
    if not out_dir.is_absolute():
        out_dir = workspace / out_dir
    flags = tuple(line.strip() for line in raw["server-flags"].splitlines() if line.strip())
    endpoint = raw["endpoint"].strip().lower()
    if endpoint not in ENDPOINT_CHOICES:
        raise UsageError(
            f"input endpoint must be auto, chat or completions, got {raw['endpoint'].strip()!r}"
        )
    layout = raw["kv-layout"].strip().lower()
    if layout not in ("split", "unified"):
        raise UsageError(
            f"input kv-layout must be split or unified, got {raw['kv-layout'].strip()!r}"
        )
    cache_ram = raw["cache-ram"].strip()
    return ActionInputs(
        mode="live" if mode == "live" else "mock",
        engine=engine,
        server_bin=raw["server-bin"].strip(),
        model=raw["model"].strip(),
        workset=raw["workset"].strip(),
        profile=raw["profile"].strip(),
        model_alias=raw["model-alias"].strip(),
        models_dir=raw["models-dir"].strip(),
        server_dir=raw["server-dir"].strip(),
        endpoint=next(e for e in ENDPOINT_CHOICES if e == endpoint),
        server_flags=flags,
        scorer=raw["scorer"].strip(),
        out_dir=out_dir,
        sign=_bool_input("sign", raw["sign"]),
        require=next(r for r in REQUIRES if r == require),
        workspace=workspace,
        baseline=baseline,
        explicit=frozenset(explicit),
        kv_layout="unified" if layout == "unified" else "split",
        engine_env=_engine_env(raw["engine-env"], engine),
        cache_arm=_bool_input("cache-arm", raw["cache-arm"]),
        cache_ram=_int_input("cache-ram", cache_ram) if cache_ram else None,
        **numbers,
    )


def _engine_env(text: str, engine: str) -> tuple[tuple[str, str], ...]:
    """``engine-env``: ``NAME=VALUE`` per line, each a variable ``engine`` reads (its options
    are ``server-flags``; any other variable would reach no server and the cert)."""
    rules = ENGINES[engine].env_rules
    found: dict[str, str] = {}
    for line in filter(str.strip, text.splitlines()):
        name, eq, value = line.strip().partition("=")
        if not eq or not name or name in found:
            raise UsageError(
                f"input engine-env: {line.strip()!r} is not one NAME=VALUE of its own; give one "
                "variable per line"
            )
        if not rules.is_engine_variable(name):
            raise UsageError(
                f"input engine-env: {name} is not a variable {engine} reads (ggml's, llama.cpp's "
                "or a runtime's); give only those, and its options as server-flags"
            )
        found[name] = value
    return tuple(sorted(found.items()))


def _abs(workspace: Path, value: str) -> Path | None:
    if not value:
        return None
    path = Path(value)
    return path if path.is_absolute() else workspace / path


def _under(workspace: Path, folder: str, value: str) -> Path | None:
    """``value`` as a path: absolute as given, else under ``folder`` when one is set (itself
    under the workspace when relative), else under the workspace."""
    if not value:
        return None
    base = _abs(workspace, folder) if folder else workspace
    assert base is not None
    return _abs(base, value)


def server_bin_path(inputs: ActionInputs) -> Path | None:
    """The ``server-bin`` file: under ``server-dir`` when set, else under the workspace."""
    return _under(inputs.workspace, inputs.server_dir, inputs.server_bin)


def model_path(inputs: ActionInputs) -> Path | None:
    """The ``model`` file: under ``models-dir`` when set, else under the workspace."""
    return _under(inputs.workspace, inputs.models_dir, inputs.model)


def check_folders(inputs: ActionInputs) -> None:
    """``models-dir`` and ``server-dir`` name folders that exist (here: in the container)."""
    for name, value in (("models-dir", inputs.models_dir), ("server-dir", inputs.server_dir)):
        folder = _abs(inputs.workspace, value)
        if folder is not None and not folder.is_dir():
            raise UsageError(
                f"input {name} {value}: no such folder here; give a folder on the runner (the "
                "action mounts it read-only into its container)"
            )


def check_server_pair(inputs: ActionInputs) -> None:
    """Live mode without a profile takes both server-bin and model, or neither (the embedded
    default, which is llama-server: another engine needs both)."""
    other_engine = inputs.mode == "live" and inputs.engine != DEFAULT_ENGINE
    if other_engine and not (inputs.server_bin and inputs.model):
        raise UsageError(
            f"input engine {inputs.engine} needs server-bin and model (the embedded default "
            "is llama-server)"
        )
    if (
        inputs.mode == "live"
        and not inputs.profile
        and bool(inputs.server_bin) != bool(inputs.model)
    ):
        raise UsageError("set both server-bin and model, or neither to run the embedded default")


def live_request(inputs: ActionInputs, embedded: tuple[Path, Path] | None) -> LiveRequest:
    """The live cell the inputs ask for. ``embedded`` is the provisioned (server, model)
    pair when the step named neither; without a work-set or profile the bundled demo
    work-set runs."""
    ws = inputs.workspace
    server_bin, model = server_bin_path(inputs), model_path(inputs)
    if embedded is not None:
        server_bin, model = embedded
    profile = None
    if inputs.profile or inputs.model_alias:
        models_dir = _abs(ws, inputs.models_dir)
        profile = ProfileRequest(
            name=inputs.profile or None,
            model_alias=inputs.model_alias or None,
            models_dir=None if models_dir is None else str(models_dir),
        )
    return LiveRequest(
        out_dir=inputs.out_dir,
        server_bin=server_bin,
        model=model,
        workset=_abs(ws, inputs.workset),
        ctx=inputs.ctx,
        parallel=inputs.parallel,
        measurement=replace(
            ACTION_DEFAULTS.measurement,
            gate_passes=inputs.gate_passes,
            reps=inputs.reps,
            n_predict=inputs.n_predict,
            cache_passes=1 if inputs.cache_arm else 0,
        ),
        launch=LaunchOptions(kv_layout=inputs.kv_layout, cache_ram=inputs.cache_ram),
        endpoint=inputs.endpoint,
        server_flags=inputs.server_flags,
        scorer=inputs.scorer or None,
        profile=profile,
        # Without a work-set or profile: the length ladder built for the cell's slot.
        bundled_workset=None if inputs.profile else LADDER,
        engine=inputs.engine,
    )


def mock_request(inputs: ActionInputs) -> MockRequest:
    """The mock cell the inputs ask for: the mock's own numbers unless the step set them
    (keeps a wiring check fast)."""
    numbers = {
        name.replace("-", "_"): getattr(inputs, name.replace("-", "_"))
        for name in _NUMBER_INPUTS
        if name in inputs.explicit
    }
    size = {name: numbers.pop(name) for name in ("ctx", "parallel") if name in numbers}
    return MockRequest(
        out_dir=inputs.out_dir,
        workset=_abs(inputs.workspace, inputs.workset),
        scorer=inputs.scorer or None,
        measurement=replace(MOCK_MEASUREMENT, **numbers),
        **size,
    )

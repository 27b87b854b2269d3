"""A cert cannot be relabelled, cannot smuggle unparseable numbers, and a cert written under
other rules says so (issue 12, sections 3 and 5). Every case goes through ``cli.main``."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from batch_invariance import __version__, exitcodes
from batch_invariance.cert.advice import engine_advice
from batch_invariance.cert.build import rederive
from batch_invariance.cert.memo import FolderMemo
from batch_invariance.cert.provenance import Provenance
from batch_invariance.cert.schema import CERT_VERSION, Cert, compute_digest
from batch_invariance.cert.store import render, write_cert
from batch_invariance.cert.verify import Depth, cert_is_green, is_promotable, verify
from batch_invariance.cli import main
from batch_invariance.core.evidence import GatePolicy
from batch_invariance.core.rules import RULES_VERSION
from tests.support.factories import (
    cert_for,
    green_evidence,
    live_provenance,
    load_cert,
    server_argv,
    spec,
)
from tests.support.report_fixtures import mock_cert as run_mock_cert


@pytest.fixture(scope="module")
def mock_cert(tmp_path_factory: pytest.TempPathFactory) -> Cert:
    """One run-mock cert for the module's forgeries: a frozen Cert each test only reads (it
    forges with ``replace`` and writes to its own tmp_path), so one mock cell serves them all."""
    # The session's run-mock cell (a GREEN exits 3, never promotable), copied here.
    return load_cert(run_mock_cert(tmp_path_factory.mktemp("mock"), 4))


def _rebuilt(tmp_path: Path, cert: Cert, name: str = "forged.json") -> Path:
    """The issue's attack: rebuild an edited cert with the package's own rederive and render
    (a fresh, correct digest and a verdict consistent with the evidence)."""
    path = tmp_path / name
    path.write_text(render(rederive(cert, engine_advice)), encoding="utf-8")
    return path


def _verify(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()  # what ran before (run-mock's progress lines) is not verify-cert's
    code = main(["verify-cert", str(path)])
    captured = capsys.readouterr()
    return code, captured.err


# ------------------------------------------------------------------ identity (section 3)


def test_a_mock_cert_relabelled_live_and_rebuilt_is_invalid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mock_cert: Cert
) -> None:
    mock = mock_cert
    assert mock.status == "green"
    forged = replace(mock, source="live")
    path = _rebuilt(tmp_path, forged)
    code, err = _verify(path, capsys)
    assert code == exitcodes.CERT_INVALID
    assert "source says live but its provenance records a mock run" in err
    assert "driver run-mock" in err and "mock knobs" in err and err.count("\n") == 1
    assert not is_promotable(rederive(forged, engine_advice)) and not cert_is_green(
        rederive(forged, engine_advice)
    )


def test_relabelled_mock_with_edited_ctx_and_n_is_invalid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mock_cert: Cert
) -> None:
    mock = mock_cert
    # A thorough forger moves the slot the sequence scope was judged against too.
    evidence = replace(mock.evidence, slot_ctx=8192)
    forged = replace(mock, source="live", ctx=8192, dispatch_n=8, evidence=evidence)
    code, err = _verify(_rebuilt(tmp_path, forged), capsys)
    assert code == exitcodes.CERT_INVALID and "a mock run is never live" in err
    # One who does not is caught by that alone.
    code, err = _verify(_rebuilt(tmp_path, replace(forged, evidence=mock.evidence)), capsys)
    assert code == exitcodes.CERT_INVALID and "evidence.slot_ctx 512 is not the cert's ctx" in err


def test_stripping_the_mock_markers_still_leaves_a_mock_argv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mock_cert: Cert
) -> None:
    mock = mock_cert
    prov = {k: v for k, v in mock.provenance.record().items() if k != "mock_knobs"}
    prov["driver"] = "run-live"
    forged = replace(
        mock, source="live", provenance=Provenance.from_record(prov), kv_label="split:-c 8192 -np 4"
    )
    code, err = _verify(_rebuilt(tmp_path, forged), capsys)
    assert code == exitcodes.CERT_INVALID and "a mock server argv" in err


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        ({"ctx": 4096}, "ctx 4096 per slot but server A ran --ctx-size 2048"),
        ({"dispatch_n": 8}, "dispatch_n 8 but server BC ran --parallel 4"),
        ({"model": "other-model"}, "model other-model but the model file recorded is"),
        (
            {"kv_label": "unified:-c 8192 -np 4 (kv-unified)"},
            "KV layout unified (kv_label) but server BC ran split",
        ),
    ],
)
def test_a_live_cert_whose_cell_was_edited_and_rebuilt_is_invalid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: dict[str, Any], named: str
) -> None:
    cert, _ = cert_for()
    assert is_promotable(cert)
    forged = replace(cert, **edit)
    code, err = _verify(_rebuilt(tmp_path, forged), capsys)
    assert code == exitcodes.CERT_INVALID and named in err, err
    assert not is_promotable(rederive(forged, engine_advice))


@pytest.mark.parametrize(
    ("a_slots", "valid"),
    [(4, True), (1, True), (2, False)],
    ids=["a-holds-the-pool", "a-on-the-share", "a-on-neither"],
)
def test_a_unified_cells_serial_server_may_hold_the_whole_pool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], a_slots: int, valid: bool
) -> None:
    """run-live --kv-layout unified runs A on one slot of the whole pool (any slot of the pool
    may fill it): a unified cert whose A ran ``ctx * N`` is consistent, as is one written
    before (A on ``ctx``); any other A context is an identity break (docs/output-contract.md,
    "Identity")."""
    assert spec().dispatch_n == 4  # the pool is 4 slots' share
    cell = replace(spec(), kv_label=f"unified:-c {spec().ctx * 4} -np 4 -kvu (one pool)")
    prov = live_provenance(cell)
    path = prov["model_file"]["path"]
    bc = server_argv(path, cell.ctx, cell.dispatch_n)
    bc[bc.index("--no-kv-unified")] = "--kv-unified"
    a = server_argv(path, cell.ctx * a_slots, 1)
    cert, _ = cert_for(cell=cell, extra_provenance={"servers": [
        {"role": "A", "argv": a}, {"role": "BC", "argv": bc},
    ]})  # fmt: skip
    code, err = _verify(_rebuilt(tmp_path, cert), capsys)
    if valid:
        assert code == exitcodes.PROMOTABLE, err
    else:
        want = f"ctx {cell.ctx} per slot but server A ran --ctx-size {cell.ctx * a_slots}"
        assert code == exitcodes.CERT_INVALID and want in err, err


@pytest.mark.parametrize(
    "provenance_edit",
    [
        lambda p: p.pop("model_file"),
        lambda p: p["model_file"].update(sha256=None),
        lambda p: p["model_file"].update(path="/elsewhere/tiny-model.gguf"),
        lambda p: p.pop("servers"),
        lambda p: p["servers"].pop(1),
        lambda p: p["servers"][1].update(argv=server_argv("/models/tiny-model.gguf", 2048, 8)),
        lambda p: p["servers"][1].update(role="C"),
        lambda p: p["servers"][1]["argv"].remove("--no-kv-unified"),
    ],
)
def test_a_live_cert_whose_provenance_disagrees_is_invalid(provenance_edit: Any) -> None:
    cert, _ = cert_for()
    prov = cert.provenance.record()
    provenance_edit(prov)
    forged = rederive(replace(cert, provenance=Provenance.from_record(prov)), engine_advice)
    verification_text = render(forged)
    assert not is_promotable(forged) and not cert_is_green(forged)
    assert json.loads(verification_text)["source"] == "live"


def test_a_profile_model_alias_is_an_accepted_model_name() -> None:
    cell = spec(model="gemma-alias")
    prov = live_provenance(cell)
    prov["model_file"] = {**prov["model_file"], "name": "gemma-3.gguf"}
    path = "/models/gemma-3.gguf"
    prov["model_file"]["path"] = path
    prov["servers"] = [
        {"role": "A", "argv": server_argv(path, cell.ctx, 1)},
        {"role": "BC", "argv": server_argv(path, cell.ctx, cell.dispatch_n)},
    ]
    cert, _ = cert_for(cell=cell)
    without_alias = rederive(replace(cert, provenance=Provenance.from_record(prov)), engine_advice)
    assert not is_promotable(without_alias)
    with_alias = rederive(
        replace(
            cert,
            provenance=Provenance.from_record({**prov, "profile": {"model_alias": "gemma-alias"}}),
        ),
        engine_advice,
    )
    assert is_promotable(with_alias)


def test_verify_cert_without_bundle_says_authenticity_was_not_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_cert(tmp_path, cert_for()[0]).path
    assert main(["verify-cert", str(path)]) == exitcodes.PROMOTABLE
    assert capsys.readouterr().out == (
        f"cert:       {path}\n"
        "cell:       model=tiny-model ctx=2048 N=4\n"
        "status:     GREEN (green)\n"
        "throughput: GREEN: N=4 buys 2.50x here (serial 64.0 tok/s, N=4 concurrent 160.0 tok/s)\n"
        "source:     live   gate: abc_union\n"
        "promotable: yes\n"
        "  - status green, source live, gate abc_union, policy no looser than defaults\n"
        "prompt cache: not measured (every arm sent cache_prompt false to a --cache-ram 0 "
        "server): covers traffic with the prompt cache off only\n"
        "sequences:  sequence length: not recorded\n"
        "signature:  not checked (no --bundle): authenticity was not checked; the digest "
        "catches accidents, not forgery\n"
        "integrity:  schema ok, digest ok, verdict re-derived from evidence matches, identity "
        "matches its provenance\n"
        "reasons:\n"
        "  - AC clean and every gate met (F1 overlap, F2 floor, F3 coverage, transport, sample "
        "size 64 >= 30, per-prompt bound 0.09375 <= 0.1 from 32 distinct prompts, median "
        "answer 80 >= 64 tokens)\n"
        "  - AB clean, no token-only differences\n"
        "  - tokens and logprobs bitwise equal at 704 positions over 32 prompts x 2 passes "
        "(64 co-batched)\n"
    )


# ------------------------------------------------- numbers JSON cannot carry (section 5)


@pytest.mark.parametrize(
    ("token", "replacement"),
    [
        ("NaN", '"rate_upper_bound_95": NaN'),
        ("Infinity", '"rate_upper_bound_95": Infinity'),
        ("-Infinity", '"rate_upper_bound_95": -Infinity'),
        ("long int", '"rate_upper_bound_95": 1' + "0" * 5000),
    ],
)
def test_nan_infinity_and_overlong_integers_are_invalid_not_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], token: str, replacement: str
) -> None:
    path = write_cert(tmp_path, cert_for()[0]).path
    text = path.read_text()
    assert '"rate_upper_bound_95": 0.09375' in text
    path.write_text(text.replace('"rate_upper_bound_95": 0.09375', replacement))
    code, err = _verify(path, capsys)
    assert code == exitcodes.CERT_INVALID, (token, err)
    assert err.count("\n") == 1 and "Traceback" not in err and "unexpected error" not in err
    assert not verify(path).promotable


@pytest.mark.parametrize("value", ["NaN", "Infinity", "1" + "0" * 5000])
def test_unparseable_numbers_in_free_form_provenance_are_invalid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    path = write_cert(tmp_path, cert_for()[0]).path
    text = path.read_text()
    path.write_text(text.replace('"provenance": {', f'"provenance": {{"x": {value}, ', 1))
    code, err = _verify(path, capsys)
    assert code == exitcodes.CERT_INVALID and err.count("\n") == 1, err
    assert "unexpected error" not in err


# ------------------------------------------- other releases and rules (section 5)


def _resealed(tmp_path: Path, **changes: Any) -> Path:
    """The factory's promotable cert with ``changes`` (``None``: the key removed), digested
    again, as a release that wrote it so would have written it."""
    data = json.loads(render(cert_for()[0]))
    data.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        data.pop(key)
    data["digest"] = compute_digest(data)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data, sort_keys=True, indent=2))
    return path


@pytest.mark.parametrize(
    ("changes", "rules"),
    [
        (
            {"tool_version": "0.0.9", "rules_version": RULES_VERSION + 1},
            f"rules {RULES_VERSION + 1}",
        ),
        (
            {"tool_version": "0.0.9", "rules_version": RULES_VERSION - 1},
            f"rules {RULES_VERSION - 1}",
        ),
        ({"tool_version": "0.0.9", "rules_version": None}, "unversioned rules of 0.0.9"),
        ({"cert_version": CERT_VERSION + 1, "tool_version": "9.0.0"}, f"rules {RULES_VERSION}"),
        (
            {"cert_version": CERT_VERSION + 1, "tool_version": "9.0.0", "new_field": [1]},
            f"rules {RULES_VERSION}",
        ),
        (
            {"cert_version": 0, "tool_version": "0.0.1", "status": "green", "rules_version": None},
            "unversioned rules of 0.0.1",
        ),
    ],
)
def test_a_cert_from_other_rules_says_so_and_is_never_promotable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, Any], rules: str
) -> None:
    path = _resealed(tmp_path, **changes)
    code, err = _verify(path, capsys)
    tool = changes["tool_version"]
    version = changes.get("cert_version", CERT_VERSION)
    assert code == exitcodes.CERT_INVALID
    assert (
        f"written by batch-invariance {tool} (cert_version {version}, {rules}); its rules are "
        "not re-derivable here" in err
    )
    assert (
        f"this is batch-invariance {__version__}, cert_version {CERT_VERSION}, rules "
        f"{RULES_VERSION}" in err
    )
    # How to re-verify: by the rules (and layout), never a pip install of the release that
    # wrote it, which may never have been published.
    assert "pip install" not in err
    recorded = changes.get("rules_version", RULES_VERSION)
    if recorded is None:
        assert f"re-derived only by the build of batch-invariance {tool} that wrote it" in err
    else:
        layout = "" if version == CERT_VERSION else f"cert_version {version} and "
        assert f"verify it with a release that reads {layout}rules {recorded}" in err
    assert "fields disagree" not in err and err.count("\n") == 1
    verification = verify(path)
    assert not verification.promotable and verification.problems
    assert not is_promotable(json.loads(path.read_text()))


@pytest.mark.parametrize("tool", ["0.0.9", "0.1.1", "2.0.0rc1"])
def test_a_cert_of_another_release_under_these_rules_verifies_and_promotes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tool: str
) -> None:
    """A release that changed no rule re-derives the certs of every release with its rules
    (the same rules_version and cert_version), so a patch release keeps them."""
    assert tool != __version__
    path = _resealed(tmp_path, tool_version=tool)
    code, err = _verify(path, capsys)
    assert code == exitcodes.PROMOTABLE, err
    verification = verify(path)
    assert verification.promotable and verification.cert is not None
    assert verification.cert.tool_version == tool
    assert verification.cert.rules_version == RULES_VERSION
    assert is_promotable(json.loads(path.read_text()))


def test_a_cert_without_rules_version_holds_the_rules_of_its_own_release(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Written before rules versions were recorded: re-derived by exactly the release that
    wrote it (as every cert was before), refused by any other (previous test)."""
    path = _resealed(tmp_path, rules_version=None)
    assert "rules_version" not in json.loads(path.read_text())
    code, err = _verify(path, capsys)
    assert code == exitcodes.PROMOTABLE, err
    verification = verify(path)
    assert verification.cert is not None and verification.cert.rules_version is None


def test_a_new_cert_records_the_rules_in_its_digest() -> None:
    cert = cert_for()[0]
    assert cert.rules_version == RULES_VERSION and cert.tool_version == __version__
    data = json.loads(render(cert))
    assert data["rules_version"] == RULES_VERSION
    data["rules_version"] = RULES_VERSION + 1  # edited after the fact: the digest says so
    assert compute_digest(data) != data["digest"]


# ------------------------------------------------------------ the promotability rule


@pytest.mark.parametrize(
    ("policy", "named"),
    [
        (GatePolicy(min_hot_trials=1), "policy min_hot_trials 1 is looser than the default 30"),
        (GatePolicy(completion_floor=0.5), "policy completion_floor 0.5 is looser"),
        (GatePolicy(coverage_fraction=0.1), "policy coverage_fraction 0.1 is looser"),
        (GatePolicy(overlap_margin_s=0.0), "policy overlap_margin_s 0.0 is looser"),
    ],
)
def test_a_green_judged_under_a_looser_policy_is_not_promotable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], policy: GatePolicy, named: str
) -> None:
    cert, _ = cert_for(policy=policy)
    assert cert.status == "green" and not is_promotable(cert) and cert_is_green(cert)
    path = write_cert(tmp_path, cert).path
    assert main(["verify-cert", str(path)]) == exitcodes.NOT_PROMOTABLE
    out = capsys.readouterr().out
    assert "promotable: no" in out and named in out


def test_a_stricter_policy_stays_promotable() -> None:
    cert, _ = cert_for(policy=GatePolicy(min_hot_trials=40, completion_floor=0.9))
    assert cert.status == "green" and is_promotable(cert)


def test_every_unmet_condition_is_listed(tmp_path: Path) -> None:
    cert, _ = cert_for(green_evidence(n_ids=6), policy=GatePolicy(min_hot_trials=1), source="mock")
    verification = verify(write_cert(tmp_path, cert).path)
    assert verification.valid and not verification.promotable
    reasons = " | ".join(verification.promotable_reasons)
    assert "source is mock" in reasons and "min_hot_trials" in reasons


def test_the_exit_code_reads_the_built_cert_as_verify_cert_does() -> None:
    """A just-built cert's promotability comes without re-deriving it (Depth.BUILT), and
    agrees with the full verification path on promotable, looser-policy and relabelled
    certs alike."""
    green, _ = cert_for()
    loose, _ = cert_for(policy=GatePolicy(coverage_fraction=0.1))
    relabelled = replace(green, ctx=4096)  # its servers ran ctx 2048: an identity problem
    for cert, promotable in ((green, True), (loose, False), (relabelled, False)):
        built = verify(cert, Depth.BUILT)
        assert built.promotable is promotable is is_promotable(cert)
    assert not verify(relabelled, Depth.BUILT).valid


def test_one_verify_entry_takes_each_depth_on_its_own_source(tmp_path: Path) -> None:
    """One entry: a path, text, object or mapping at FULL agree; BUILT and PARSED take a
    Cert only, and a memo is read at REMEMBERED only (anything else is a caller's bug)."""
    green, _ = cert_for()
    path = write_cert(tmp_path, green).path
    full = verify(path)
    assert full.valid and full.path == path and verify(path, Depth.REMEMBERED).valid
    text = path.read_text(encoding="utf-8")
    assert verify(text).promotable is verify(json.loads(text)).promotable is full.promotable
    assert verify(green, Depth.PARSED).valid and verify(green, Depth.BUILT).valid
    with pytest.raises(TypeError):
        verify(text, Depth.BUILT)
    with pytest.raises(TypeError):
        verify(json.loads(text), Depth.PARSED)
    with pytest.raises(TypeError):
        verify(text, Depth.FULL, memo=FolderMemo(tmp_path / "memo"))

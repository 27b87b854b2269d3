"""Profile loading, the models.toml registry, command-line precedence and make-workset."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from batch_invariance.cli import main
from batch_invariance.errors import UsageError
from batch_invariance.profiles.loader import bundled_profiles, load_profile
from batch_invariance.profiles.models import (
    fill_models_dir,
    load_toml,
    parse_registry,
    read_registry,
)
from batch_invariance.profiles.overrides import resolve_profile_run
from batch_invariance.profiles.spark.scorer import SparkScorer
from batch_invariance.profiles.tokens import approx_token_count
from batch_invariance.run.workset import load_workset
from batch_invariance.scorer_api import ExactMatchScorer

MODELS_TOML = """
[defaults]
server_bin = "/opt/default/llama-server"
server_flags = ["--threads", "2"]

[[models]]
alias = "tiny"
gguf = "{MODELS_DIR}/tiny.gguf"
kv = "f16"

[[models]]
alias = "big"
gguf = "{MODELS_DIR}/sub/big.gguf"
kv = "q8_0"
server_flags = ["-ngl", "99"]
server_bin = "/opt/cuda/llama-server"
"""


@pytest.fixture
def models_setup(tmp_path: Path) -> tuple[Path, Path]:
    """A models.toml in a work folder and a models folder with both GGUFs."""
    work = tmp_path / "work"
    models = tmp_path / "models"
    (models / "sub").mkdir(parents=True)
    work.mkdir()
    (models / "tiny.gguf").write_bytes(b"GGUF")
    (models / "sub" / "big.gguf").write_bytes(b"GGUF")
    (work / "models.toml").write_text(MODELS_TOML)
    return work, models


# ------------------------------------------------------------------ loading
def test_spark_is_bundled_and_loads() -> None:
    assert "spark" in bundled_profiles()
    profile = load_profile("spark")
    assert profile.name == "spark" and profile.bundled
    assert profile.corners == ("balanced", "short", "long")
    assert profile.default_corner == "balanced"
    assert profile.models_example.is_file()
    assert isinstance(profile.scorer(), SparkScorer)
    items = profile.generate(4096, "short", 0, approx_token_count)
    assert items and all(i.family for i in items)


def test_bundled_models_example_parses() -> None:
    profile = load_profile("spark")
    registry = read_registry(profile.models_example)
    entry = registry.entry("gemma3-270m")
    assert entry.gguf == "{MODELS_DIR}/gemma-3-270m-q4_k_m.gguf"
    assert entry.kv == "f16"


def test_unknown_profile_lists_the_bundled_ones() -> None:
    with pytest.raises(UsageError, match=r"bundled: spark"):
        load_profile("no-such-profile")


def write_user_profile(root: Path, scorer_body: str, workset_body: str | None = None) -> Path:
    root.mkdir(parents=True)
    (root / "profile.toml").write_text(
        '[profile]\nname = "mine"\n[workset]\ncorners = ["only"]\ndefault_seed = 4\n'
    )
    (root / "helpers.py").write_text("ANSWER = 'forty-two'\n")
    (root / "workset.py").write_text(
        workset_body
        or textwrap.dedent(
            """
            from batch_invariance.run.workset import WorkItem
            from .helpers import ANSWER

            def generate(ctx, corner, seed, token_counter):
                text = "x " * (ctx // 10)
                return [WorkItem(test_id=f"q{seed}", prompt=text, messages=None,
                                 expected_answer=ANSWER, family="Q", fill=0.1,
                                 meta={"n": token_counter(text)})]
            """
        )
    )
    (root / "scorer.py").write_text(scorer_body)
    return root


GOOD_SCORER = textwrap.dedent(
    """
    from batch_invariance.scorer_api import ExactMatchScorer

    def make_scorer():
        return ExactMatchScorer()
    """
)


def test_user_profile_folder_with_relative_imports(tmp_path: Path) -> None:
    root = write_user_profile(tmp_path / "myprof", GOOD_SCORER)
    profile = load_profile(str(root))
    assert profile.name == "mine" and not profile.bundled
    assert isinstance(profile.scorer(), ExactMatchScorer)
    ws = profile.workset(100)
    assert [i.test_id for i in ws.items] == ["q4"]
    assert ws.items[0].expected_answer == "forty-two"
    assert ws.items[0].meta["n"] == approx_token_count("x " * 10)
    with pytest.raises(UsageError, match="unknown --corner"):
        profile.generate(100, "balanced")


@pytest.mark.parametrize(
    ("scorer_body", "match"),
    [
        ("import no_such_module_xyz\n", r"loading .*scorer\.py failed: ModuleNotFoundError"),
        ("def make_scorer(:\n", r"loading .*scorer\.py failed: SyntaxError"),
        ("X = 1\n", r"scorer\.py must define a function make_scorer\(\)"),
        ("def make_scorer():\n    return 3\n", r"make_scorer\(\) returned int"),
        (
            "def make_scorer():\n    raise RuntimeError('boom')\n",
            r"make_scorer\(\) failed: RuntimeError: boom",
        ),
    ],
)
def test_broken_user_scorer_is_one_clear_usage_error(
    tmp_path: Path, scorer_body: str, match: str
) -> None:
    root = write_user_profile(tmp_path / "p", scorer_body)
    with pytest.raises(UsageError, match=match):
        load_profile(str(root)).scorer()


def test_broken_user_workset_is_one_clear_usage_error(tmp_path: Path) -> None:
    root = write_user_profile(
        tmp_path / "p",
        GOOD_SCORER,
        "def generate(ctx, corner, seed, token_counter):\n    return [1 / 0]\n",
    )
    with pytest.raises(UsageError, match=r"workset\.py: generate\(\) failed: ZeroDivisionError"):
        load_profile(str(root)).generate(100)
    root2 = write_user_profile(
        tmp_path / "p2",
        GOOD_SCORER,
        "def generate(ctx, corner, seed, token_counter):\n    return []\n",
    )
    with pytest.raises(UsageError, match="non-empty list"):
        load_profile(str(root2)).generate(100)


def test_profile_folder_missing_files(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match=r"lacks profile\.toml, workset\.py, scorer\.py"):
        load_profile(str(tmp_path / "empty"))


def test_broken_profile_error_reaches_the_cli_as_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = write_user_profile(tmp_path / "p", "import no_such_module_xyz\n")
    code = main(
        ["make-workset", "--profile", str(root), "--ctx", "100", "--out", str(tmp_path / "o.json")]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "scorer.py failed" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o.json").exists()


# ------------------------------------------------------------------ models.toml
def test_registry_merges_defaults_and_rows() -> None:
    reg = parse_registry(load_toml(MODELS_TOML, "models.toml"), "models.toml")
    tiny, big = reg.entry("tiny"), reg.entry("big")
    assert tiny.server_bin == "/opt/default/llama-server"
    assert tiny.server_flags == ("--threads", "2")
    assert big.server_bin == "/opt/cuda/llama-server"
    assert big.server_flags == ("--threads", "2", "-ngl", "99")
    assert fill_models_dir(big, "/m", "models.toml") == Path("/m/sub/big.gguf")


def test_unknown_alias_lists_the_known_ones() -> None:
    reg = parse_registry(load_toml(MODELS_TOML, "models.toml"), "models.toml")
    with pytest.raises(UsageError, match=r"unknown --model-alias 'huge'.*known aliases: big, tiny"):
        reg.entry("huge")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[[models]]\nalias = 'a'\ngguf = 'x'\n", r"models\.0\.kv: Field required"),
        ("[[models]]\nalias='a'\ngguf='x'\nkv='f16'\nflags=[]\n", r"models\.0\.flags"),
        (
            "[[models]]\nalias='a'\ngguf='x'\nkv='f16'\n[[models]]\nalias='a'\ngguf='y'\nkv='f16'\n",
            "defined twice",
        ),
        ("[defaults]\nserver_flags = '-ngl 99'\n", r"defaults\.server_flags"),
    ],
)
def test_malformed_registry_rows(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "models.toml"
    path.write_text(text)
    with pytest.raises(UsageError, match=match):
        read_registry(path)


def test_registry_that_is_not_toml(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text("[[models]\n")
    with pytest.raises(UsageError, match="not valid TOML"):
        read_registry(path)


def test_resolve_fills_models_dir_from_flag_or_env(models_setup: tuple[Path, Path]) -> None:
    work, models = models_setup
    run = resolve_profile_run("spark", "big", str(models), env={}, cwd=work)
    assert run.model == str(models / "sub" / "big.gguf")
    assert run.server_bin == "/opt/cuda/llama-server"
    assert run.kv == "q8_0"
    assert run.server_flags == (
        "--threads",
        "2",
        "-ngl",
        "99",
        "--cache-type-k",
        "q8_0",
        "--cache-type-v",
        "q8_0",
    )
    assert run.models_toml == str(work / "models.toml")
    via_env = resolve_profile_run("spark", "tiny", None, env={"MODELS_DIR": str(models)}, cwd=work)
    assert via_env.model == str(models / "tiny.gguf")
    # The flag beats the environment.
    other = models.parent / "other"
    other.mkdir()
    (other / "tiny.gguf").write_bytes(b"GGUF")
    both = resolve_profile_run(
        "spark", "tiny", str(other), env={"MODELS_DIR": str(models)}, cwd=work
    )
    assert both.model == str(other / "tiny.gguf")


def test_missing_models_dir_and_missing_file(models_setup: tuple[Path, Path]) -> None:
    work, models = models_setup
    with pytest.raises(
        UsageError, match=r"uses \{MODELS_DIR\}.*--models-dir DIR or set MODELS_DIR"
    ):
        resolve_profile_run("spark", "tiny", None, env={}, cwd=work)
    (models / "tiny.gguf").unlink()
    with pytest.raises(UsageError, match=r"model file for alias 'tiny' not found: .*tiny\.gguf"):
        resolve_profile_run("spark", "tiny", str(models), env={}, cwd=work)


def test_no_models_toml_says_what_to_copy(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"copy .*models\.example\.toml to \./models\.toml"):
        resolve_profile_run("spark", "tiny", str(tmp_path), env={}, cwd=tmp_path)


def test_command_line_beats_the_profile(models_setup: tuple[Path, Path]) -> None:
    work, models = models_setup
    run = resolve_profile_run(
        "spark",
        "big",
        str(models),
        {
            "server_bin": "/my/llama-server",
            "model": "/my/model.gguf",
            "kv": "q4_0",
            "server_flags": ["-ngl", "0"],
            "corner": "short",
            "seed": 9,
            "scorer": "batch_invariance.scorer_api:ExactMatchScorer",
            "models_file": str(work / "models.toml"),
            "n_predict": None,  # unset values are ignored
        },
        env={},
        cwd=models,  # not the folder with models.toml: models_file points at it
    )
    assert run.server_bin == "/my/llama-server"
    assert run.model == "/my/model.gguf"
    assert run.kv == "q4_0"
    # Registry flags first, the command line's last (llama-server takes the last value).
    assert run.server_flags[-2:] == ("-ngl", "0")
    assert "--cache-type-k" in run.server_flags and "q4_0" in run.server_flags
    assert (run.corner, run.seed) == ("short", 9)
    assert isinstance(run.scorer, ExactMatchScorer)


def test_profile_without_alias_uses_only_the_command_line(tmp_path: Path) -> None:
    run = resolve_profile_run("spark", None, None, {"model": "/x.gguf"}, env={}, cwd=tmp_path)
    assert run.model == "/x.gguf" and run.server_bin is None and run.kv is None
    assert run.server_flags == ()
    assert isinstance(run.scorer, SparkScorer)
    assert run.corner == "balanced" and run.seed == 0


def test_prompts_do_not_depend_on_the_model_alias(models_setup: tuple[Path, Path]) -> None:
    work, models = models_setup
    a = resolve_profile_run("spark", "tiny", str(models), env={}, cwd=work)
    b = resolve_profile_run("spark", "big", str(models), env={}, cwd=work)
    assert (
        a.build_workset(4096, approx_token_count).sha256
        == b.build_workset(4096, approx_token_count).sha256
    )


# ------------------------------------------------------------------ make-workset
def test_make_workset_writes_a_loadable_deterministic_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out1, out2 = tmp_path / "a.json", tmp_path / "b.json"
    args = ["make-workset", "--profile", "spark", "--ctx", "8192", "--corner", "short"]
    args += ["--seed", "3"]
    assert main([*args, "--out", str(out1)]) == 0
    assert main([*args, "--out", str(out2)]) == 0
    assert out1.read_bytes() == out2.read_bytes()
    printed = capsys.readouterr().out
    assert "wrote 20 items" in printed and "offline estimate" in printed
    ws = load_workset(out1)
    assert len(ws.items) == 20
    assert {i.fill for i in ws.items} == {0.05, 0.15}
    rows = json.loads(out1.read_text())
    assert all(r["corner"] == "short" and r["seed"] == 3 for r in rows)
    # Same items as the in-memory profile work-set.
    mem = load_profile("spark").workset(8192, "short", 3)
    assert [i.test_id for i in mem.items] == [i.test_id for i in ws.items]
    assert [i.prompt for i in mem.items] == [i.prompt for i in ws.items]


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--corner", "huge"], "corner"),
        (["--ctx", "50", "--corner", "short"], "too small"),
        (["--ctx", "-1"], "positive"),
    ],
)
def test_make_workset_bad_input_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], match: str
) -> None:
    out = tmp_path / "w.json"
    argv = ["make-workset", "--profile", "spark", "--ctx", "4096", "--out", str(out), *extra]
    assert main(argv) == 2
    assert match in capsys.readouterr().err
    assert not out.exists()


def test_make_workset_unreachable_server_is_infra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "w.json"
    argv = ["make-workset", "--profile", "spark", "--ctx", "2048", "--corner", "short"]
    code = main([*argv, "--out", str(out), "--server-url", "http://127.0.0.1:9"])
    assert code == 4
    assert "tokenizing a calibration prompt" in capsys.readouterr().err
    assert not out.exists()


def test_registry_server_bin_expands_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    (tmp_path / "models.toml").write_text(
        '[defaults]\nserver_bin = "~/bin/llama-server"\n'
        '[[models]]\nalias = "a"\ngguf = "{MODELS_DIR}/m.gguf"\nkv = "f16"\n'
    )
    run = resolve_profile_run("spark", "a", "~", env={}, cwd=tmp_path)
    assert run.server_bin == str(tmp_path / "bin" / "llama-server")
    assert run.model == str(tmp_path / "m.gguf")

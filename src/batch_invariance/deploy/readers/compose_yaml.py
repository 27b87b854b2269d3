"""Compose YAML inside a closed grammar, on which PyYAML (YAML 1.1) and compose's Go reader
(YAML 1.2) agree (pure).

One document; no anchors, aliases, merge keys, tags or block scalars. Scalars are returned as
the text written, but for a plain ``true``/``false`` where compose takes a boolean
(:data:`BOOLEAN_KEYS`). Any other plain scalar must read as a string in YAML 1.2's core schema
and not be a YAML 1.1 boolean or null word (``yes``, ``off``, ...), or be a decimal integer.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from batch_invariance.deploy.readers.source_bytes import BOUND, MAX_NESTING
from batch_invariance.gate.server_command import NotUnderstood

_DECIMAL = re.compile(r"0|-?[1-9][0-9]*")
#: YAML 1.2 core schema (10.3.2): the plain scalars that are not strings.
_CORE_TYPED = re.compile(
    r"null|Null|NULL|~|true|True|TRUE|false|False|FALSE|[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+"
    r"|[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)"
    r"|\.nan|\.NaN|\.NAN"
)
#: YAML 1.1's booleans and nulls (any case).
_KEYWORDS = frozenset(["y", "n", "yes", "no", "true", "false", "on", "off", "null", "~"])
#: The plain booleans both readers read alike (YAML 1.2 core schema; YAML 1.1 reads them too).
_BOOLEANS = {"true": True, "True": True, "TRUE": True, "false": False, "False": False,
             "FALSE": False}  # fmt: skip
#: Where compose takes a boolean (``*``: any key or list index), read as a Python ``bool``:
#: everywhere else a boolean is refused, since compose would pass it on as text.
BOOLEAN_KEYS: tuple[tuple[str, ...], ...] = (
    ("services", "*", "volumes", "*", "read_only"),
    *(("services", "*", key) for key in ("init", "read_only", "tty", "stdin_open")),
    ("services", "*", "healthcheck", "disable"),
)


class Refused(Exception):
    """A construct of a compose file refused at its line, with how to write it instead."""

    def __init__(self, line: int, construct: str, fix: str = "") -> None:
        super().__init__(construct)
        self.line, self.construct, self.fix = line, construct, fix


class YamlRefused(Exception):
    def __init__(self, line: int, construct: str) -> None:
        super().__init__(construct)
        self.line, self.construct = line, construct


_OPENS = (
    yaml.BlockMappingStartToken, yaml.BlockSequenceStartToken, yaml.FlowMappingStartToken,
    yaml.FlowSequenceStartToken,
)  # fmt: skip
_CLOSES = (yaml.BlockEndToken, yaml.FlowMappingEndToken, yaml.FlowSequenceEndToken)


def _scan(text: str) -> list[yaml.Token]:
    """The document's tokens, scanned once (the composer reads them: :class:`_Tokens`). A
    collection nested deeper than :data:`MAX_NESTING` is refused at its line before anything
    recurses into it (PyYAML's composer recurses once per level: thousands of levels were a
    RecursionError), and the scan stops there."""
    tokens: list[yaml.Token] = []
    documents = depth = 0
    for token in yaml.scan(text):
        tokens.append(token)
        line = token.start_mark.line + 1
        if isinstance(token, _OPENS):
            depth += 1
            if depth > MAX_NESTING:
                raise YamlRefused(line, f"YAML nested deeper than {MAX_NESTING} levels ({BOUND})")
        elif isinstance(token, _CLOSES):
            depth -= 1
        if isinstance(token, (yaml.AnchorToken, yaml.AliasToken)):
            raise YamlRefused(line, "a YAML anchor or alias")
        if isinstance(token, yaml.TagToken):
            raise YamlRefused(line, "a YAML tag")
        if isinstance(token, yaml.DocumentStartToken):
            documents += 1
            if documents > 1:
                raise YamlRefused(line, "a second YAML document")
        if isinstance(token, yaml.DirectiveToken):
            raise YamlRefused(line, "a YAML directive")
    return tokens


class _Tokens(yaml.parser.Parser, yaml.composer.Composer, yaml.resolver.Resolver):
    """PyYAML's parser and composer (those of ``yaml.compose``) over tokens already scanned:
    the scan is not done twice."""

    def __init__(self, tokens: list[yaml.Token]) -> None:
        self.tokens, self.taken = tokens, 0
        yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        yaml.resolver.Resolver.__init__(self)

    def check_token(self, *choices: type[yaml.Token]) -> bool:
        if self.taken >= len(self.tokens):
            return False
        return not choices or isinstance(self.tokens[self.taken], choices)

    def peek_token(self) -> yaml.Token | None:
        return self.tokens[self.taken] if self.taken < len(self.tokens) else None

    def get_token(self) -> yaml.Token | None:
        token = self.peek_token()
        self.taken += token is not None
        return token


def _takes_boolean(path: tuple[str, ...]) -> bool:
    return any(
        len(path) == len(keys) and all(k in ("*", p) for k, p in zip(keys, path, strict=True))
        for keys in BOOLEAN_KEYS
    )


def _value(node: yaml.Node, path: tuple[str, ...] = (), any_boolean: bool = False) -> Any:
    line = node.start_mark.line + 1
    if isinstance(node, yaml.ScalarNode):
        text = str(node.value)
        if node.style in ("'", '"'):
            return text
        if node.style in ("|", ">"):
            raise YamlRefused(line, "a YAML block scalar")
        if text == "" and node.style is None:
            return None  # an empty value (``key:``): null in both readers
        if text in _BOOLEANS and (any_boolean or _takes_boolean(path)):
            return _BOOLEANS[text]
        typed = _CORE_TYPED.fullmatch(text) and not _DECIMAL.fullmatch(text)
        if typed or text.lower() in _KEYWORDS:
            raise YamlRefused(line, f"plain YAML value {text[:40]!r} (quote it)")
        return text
    if isinstance(node, yaml.SequenceNode):
        return [_value(item, (*path, "*"), any_boolean) for item in node.value]
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = _value(key_node)
            if not isinstance(key, str) or key == "<<":
                raise YamlRefused(line, "a YAML merge key or a non-text key")
            if key in out:
                raise YamlRefused(key_node.start_mark.line + 1, f"key {key} given twice")
            value = _value(value_node, (*path, key), any_boolean)
            out[key] = (value, value_node.start_mark.line + 1)
        return out
    raise YamlRefused(line, "a YAML node")  # pragma: no cover - PyYAML has no other kind


def load(text: str, shown: str, any_boolean: bool = False) -> dict[str, Any] | NotUnderstood:
    """The document as nested dicts (values as ``(value, line)``), lists and text; with
    ``any_boolean`` a plain ``true``/``false`` is a boolean wherever it stands (a Kubernetes
    manifest, whose schema types every field)."""
    try:
        node = _Tokens(_scan(text)).get_single_node()
        value = {} if node is None else _value(node, (), any_boolean)
    except YamlRefused as exc:
        return NotUnderstood(shown, exc.line, exc.construct, "write plain compose YAML")
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 0
        return NotUnderstood(shown, line, f"not valid YAML ({getattr(exc, 'problem', exc)})")
    if not isinstance(value, dict):
        return NotUnderstood(shown, 1, "a YAML document that is not a mapping")
    return value


def plain(value: Any) -> Any:
    """A loaded value without its line numbers."""
    if isinstance(value, dict):
        return {k: plain(v[0]) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value

"""V4.1 tool-call grammars in which every DSML tag is the DSML *token*, never its spelling.

SGLang constrains a `required` or named `tool_choice` (and strict tools) with xgrammar's
builtin `deepseek_v4_1` structural tag. Its strings spell `<｜DSML｜ calls>`, its
`deepseek_v4_1_xml` arguments style spells the parameter tags, and xgrammar matches strings by
the bytes of tokens, so the text pieces `<`, `｜`, `DSML`, `｜` satisfy it as well as the DSML
token does. A model under that grammar can write a whole call in spelled DSML, which our
token-level parser (docs/ENCODING.md §4.4) must read as plain text: with the tiny checkpoint
and a named tool choice the client got the block in `content` instead of a call.

`token_exact` rewrites such a tag (in its JSON form, as SGLang hands it to the grammar
backend): each special-token spelling becomes a token element, and each invoke's arguments
follow the renderer's layout (docs/ENCODING.md §2.7) exactly:

    '<' DSML ' invoke name="NAME">\\n' (PARAM '\\n')+ '</' DSML ' invoke>'   (an empty body: '\\n')
    PARAM = '<' DSML ' parameter name="KEY" string="true">'  RAW  '</' DSML ' parameter>'
          | '<' DSML ' parameter name="KEY" string="false">' JSON '</' DSML ' parameter>'

With a schema (strict tools): the declared properties in declared order, the required ones
present, a string-typed property raw (`enum` / `const` enforced) and any other as JSON of its
schema; without one (xgrammar's `true`): any keys, raw or JSON values. `grammar_compile.py`
compiles the result with every special token *reserved*, so no text can stand in for a token
element and no special token can appear inside raw text or JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sglang_ds41.encoding.special_tokens import Special

Format = dict[str, Any]

V41_ARGUMENTS_STYLE = "deepseek_v4_1_xml"
V41_CALLS_OPENER = f"<{Special.DSML.value} calls>"
_V41_CALLS_OPENER_ESCAPED = json.dumps(V41_CALLS_OPENER)[1:-1]  # as json.dumps writes it in a tag
# json_schema values that constrain nothing (xgrammar's mapping of a non-strict tool).
_ANY_SCHEMA: tuple[Any, ...] = (True, {}, None)
# A key of an unconstrained call: what the parser reads back as a JSON key from name="..."
# (it ends the name at a space, and writes it into the JSON unescaped).
_FREE_KEY = r'[^"\\<>\x00-\x20]+'
_MAX_REF_HOPS = 16


class UnsupportedTag(ValueError):
    """The tag has a shape this rewrite does not know; SGLang compiles it unchanged."""


def spells_v41_calls(tag_json: str) -> bool:
    """The tag (its JSON text, ASCII-escaped or not) constrains V4.1 tool calls (V4.1's calls
    opener has a space: ` calls`). Read off the text, so other tags are not parsed for it."""
    return V41_CALLS_OPENER in tag_json or _V41_CALLS_OPENER_ESCAPED in tag_json


def token_exact(tag: Mapping[str, Any], special_ids: Mapping[str, int]) -> Format:
    """`tag` with its special spellings as token elements and V4.1 arguments per docs/ENCODING.md §2.7."""
    if tag.get("type", "structural_tag") != "structural_tag" or not isinstance(tag.get("format"), dict):
        raise UnsupportedTag("not a structural tag with a format")
    return {"type": "structural_tag", "format": _Rewrite(special_ids).node(tag["format"])}


# ---- format constructors -------------------------------------------------------------------


def _const(value: str) -> Format:
    return {"type": "const_string", "value": value}


def _seq(*elements: Format) -> Format:
    flat = [e for e in elements if e != _EMPTY]
    return flat[0] if len(flat) == 1 else {"type": "sequence", "elements": flat}


def _or(elements: list[Format]) -> Format:
    return elements[0] if len(elements) == 1 else {"type": "or", "elements": elements}


def _optional(content: Format) -> Format:
    return {"type": "optional", "content": content}


def _star(content: Format) -> Format:
    return {"type": "star", "content": content}


_EMPTY: Format = {"type": "sequence", "elements": []}


class _Rewrite:
    def __init__(self, special_ids: Mapping[str, int]) -> None:
        self.ids = dict(special_ids)
        self.dsml = self._token(Special.DSML.value)
        self.split_re = re.compile("|".join(re.escape(s) for s in sorted(self.ids, key=len, reverse=True)))

    # ---- text with special spellings ----

    def _token(self, spelling: str) -> Format:
        if spelling not in self.ids:
            raise UnsupportedTag(f"no token id for {spelling!r}")
        return {"type": "token", "token": self.ids[spelling]}

    def pieces(self, text: str) -> list[Format]:
        out: list[Format] = []
        start = 0
        for match in self.split_re.finditer(text):
            if match.start() > start:
                out.append(_const(text[start : match.start()]))
            out.append(self._token(match.group()))
            start = match.end()
        if start < len(text):
            out.append(_const(text[start:]))
        return out

    def text(self, text: str | Format) -> Format:
        if isinstance(text, dict):  # already a format (a token element)
            return text
        return _seq(*self.pieces(text)) if text else _EMPTY

    def has_special(self, text: str) -> bool:
        return bool(self.split_re.search(text))

    def _delimiter(self, text: str | list[str] | Format) -> str | list[str] | Format | None:
        """A tag's begin/end as TagFormat takes it (text or one token), else None."""
        if isinstance(text, dict):  # already a token element
            return text
        if isinstance(text, list):
            return None if any(self.has_special(t) for t in text) else text
        if not self.has_special(text):
            return text
        pieces = self.pieces(text)
        return pieces[0] if len(pieces) == 1 else None

    # ---- the format tree ----

    def node(self, node: Format) -> Format:
        kind = node.get("type")
        if kind == "const_string":
            return self.text(node["value"])
        if kind in ("sequence", "or"):
            return {**node, "elements": [self.node(e) for e in node["elements"]]}
        if kind in ("optional", "plus", "star", "repeat"):
            return {**node, "content": self.node(node["content"])}
        if kind == "tag":
            return self.tag(node)
        if kind == "tags_with_separator":
            return self.tags_with_separator(node)
        if kind == "triggered_tags":
            return self.triggered_tags(node)
        if kind == "json_schema":
            if node.get("style") == V41_ARGUMENTS_STYLE:
                if node.get("any_order"):
                    raise UnsupportedTag("arguments in any order")
                return self.arguments(node.get("json_schema"))
            if node.get("style", "json") == "json":
                return node
        if kind == "any_text":
            # A reserved token cannot be text, so excluding its spelling would only forbid text.
            return {**node, "excludes": [s for s in node.get("excludes", []) if s not in self.ids]}
        if kind in ("regex", "grammar", "token", "exclude_token", "any_tokens") and not self.has_special(
            json.dumps(node, ensure_ascii=False)
        ):
            return node
        raise UnsupportedTag(f"format {kind!r} ({json.dumps(node, ensure_ascii=False)[:200]})")

    def tag(self, node: Format) -> Format:
        content = self.node(node["content"])
        begin, end = self._delimiter(node["begin"]), self._delimiter(node["end"])
        if begin is not None and end is not None:
            return {**node, "begin": begin, "content": content, "end": end}
        if _open_ended(content) or isinstance(node["end"], list):
            raise UnsupportedTag("open-ended content delimited by text and special tokens")
        return _seq(self.text(node["begin"]), content, self.text(node["end"]))

    def tags_with_separator(self, node: Format) -> Format:
        tags = [self.tag(t) for t in node["tags"]]
        if all(t.get("type") == "tag" for t in tags) and not self.has_special(node.get("separator", "")):
            return {**node, "tags": tags}
        one = _or(tags)
        body = one
        if not node.get("stop_after_first", False):
            body = _seq(one, _star(_seq(self.text(node.get("separator", "")), one)))
        return body if node.get("at_least_one", False) else _optional(body)

    def triggered_tags(self, node: Format) -> Format:
        """Free text until the DSML token, then the tag. The text before the token (`<`) stays
        free text, since xgrammar dispatches on one token and cannot look back; a block without
        it is still taken as calls by the token-level parser (docs/ENCODING.md §4.2, difference 5)."""
        tags = []
        for trigger in node["triggers"]:
            head = self.pieces(trigger)
            at = next((i for i, p in enumerate(head) if p.get("type") == "token"), None)
            if at is None or any(p.get("type") == "token" for p in head[at + 1 :]):
                raise UnsupportedTag(f"trigger {trigger!r} is not one special token and text")
        for tag in node["tags"]:
            pieces = self.pieces(tag["begin"])
            at = next((i for i, p in enumerate(pieces) if p.get("type") == "token"), None)
            if at is None or isinstance(tag["end"], list):
                raise UnsupportedTag(f"triggered tag {tag['begin']!r} has no special token")
            end = self.pieces(tag["end"])
            if not end:
                raise UnsupportedTag(f"triggered tag {tag['begin']!r} has no end")
            # The tag's end must be non-empty for xgrammar: the last piece of upstream's end.
            last = end[-1]["value"] if end[-1]["type"] == "const_string" else end[-1]
            tags.append(
                {
                    "type": "tag",
                    "begin": pieces[at],
                    "content": _seq(*pieces[at + 1 :], self.node(tag["content"]), *end[:-1]),
                    "end": last,
                }
            )
        excludes = node.get("excludes", [])
        if any(e not in self.ids for e in excludes):
            raise UnsupportedTag(f"text excludes {excludes!r} in a token-triggered tag")
        return {
            "type": "token_triggered_tags",
            "trigger_tokens": sorted({t["begin"]["token"] for t in tags}),
            "tags": tags,
            "exclude_tokens": [self.ids[e] for e in excludes],
            "at_least_one": node.get("at_least_one", False),
            "stop_after_first": node.get("stop_after_first", False),
        }

    # ---- one invoke's arguments (ENCODING.md §2.7) ----

    def arguments(self, schema: Any) -> Format:
        """The invoke body after `name="NAME">\\n`: each parameter then a newline; none: one
        newline (`<D invoke name="f">\\n\\n</D invoke>`)."""
        newline = _const("\n")
        properties = schema.get("properties") if isinstance(schema, dict) else None
        free = {"type": "plus", "content": _seq(self.free_parameter(), newline)}
        if schema in _ANY_SCHEMA or not isinstance(properties, dict) or not properties:
            if isinstance(schema, dict) and schema.get("additionalProperties") is False:
                return newline
            return _or([newline, free])
        unsupported = sorted(_UNSUPPORTED_OBJECT_KEYWORDS & set(schema))
        if schema.get("additionalProperties") not in (None, False):
            unsupported.append("additionalProperties")  # a free key could repeat a declared one
        required = set(schema.get("required", []))
        if unsupported or not required <= set(properties):
            what = unsupported or "required names it does not declare"
            raise UnsupportedTag(f"arguments schema with {what}")
        _check_refs(schema)
        defs = {k: schema[k] for k in ("$defs", "definitions") if isinstance(schema.get(k), dict)}
        items = [
            (name in required, _seq(self.parameter(name, sub, defs), newline))
            for name, sub in properties.items()
        ]
        # Only the declared keys (xgrammar's strict default for an unset additionalProperties).
        if any(needed for needed, _ in items):
            return _seq(*(item if needed else _optional(item) for needed, item in items))
        # All optional: at least one (then the later ones optional) or the empty body.
        firsts = [
            _seq(item, *(_optional(later) for _, later in items[i + 1 :]))
            for i, (_, item) in enumerate(items)
        ]
        return _or([newline, *firsts])

    def _open(self, key_part: Format, string: str) -> Format:
        opening = _const(f'" string="{string}">')
        return _seq(_const("<"), self.dsml, _const(' parameter name="'), key_part, opening)

    def _close(self) -> Format:
        return _seq(_const("</"), self.dsml, _const(" parameter>"))

    def _raw(self, key_part: Format) -> Format:
        """A raw string value: any text up to `</` DSML (the token ends it; text cannot)."""
        return _seq(
            _const("<"),
            self.dsml,
            _const(' parameter name="'),
            key_part,
            {
                "type": "tag",
                "begin": '" string="true">',
                "content": _seq({"type": "any_text", "excludes": []}, _const("</")),
                "end": self.dsml,
            },
            _const(" parameter>"),
        )

    def parameter(self, name: str, schema: Any, defs: Mapping[str, Any]) -> Format:
        key = _const(name)
        kinds = _kinds(_resolve(schema, defs), defs)
        variants = []
        if kinds.raw:
            if kinds.literals is None:
                variants.append(self._raw(key))
            else:
                one_of = _or([_const(v) for v in kinds.literals])
                variants.append(_seq(self._open(key, "true"), one_of, self._close()))
        if kinds.json:
            value = {"type": "json_schema", "json_schema": _with_defs(schema, defs)}
            variants.append(_seq(self._open(key, "false"), value, self._close()))
        if not variants:
            raise UnsupportedTag(f"parameter {name!r}: its schema admits no value")
        return _or(variants)

    def free_parameter(self) -> Format:
        key = {"type": "regex", "pattern": _FREE_KEY}
        any_json = {"type": "json_schema", "json_schema": True}
        json_value = _seq(self._open(key, "false"), any_json, self._close())
        return _or([self._raw(key), json_value])


# ---- what a property schema admits --------------------------------------------------------

# Object keywords the parameter grammar does not express (it would refuse valid calls).
_UNSUPPORTED_OBJECT_KEYWORDS = frozenset({"patternProperties", "propertyNames", "dependentRequired",
                                          "dependentSchemas", "dependencies", "unevaluatedProperties"})
_LOCAL_REF_PREFIXES = ("#/$defs/", "#/definitions/")


@dataclass(frozen=True)
class _Kinds:
    """How a property's value may be written: raw (`string="true"`, any text or only
    `literals`) and/or as JSON (`string="false"`)."""

    raw: bool
    literals: tuple[str, ...] | None
    json: bool


_ANYTHING = _Kinds(raw=True, literals=None, json=True)


def _kinds(schema: Any, defs: Mapping[str, Any]) -> _Kinds:
    """A string value is written raw; anything else (or a string) as JSON of the schema."""
    if schema is False:
        return _Kinds(raw=False, literals=None, json=False)
    if not isinstance(schema, dict):
        return _ANYTHING
    if "const" in schema or isinstance(schema.get("enum"), list):
        values = [schema["const"]] if "const" in schema else schema["enum"]
        strings = tuple(v for v in values if isinstance(v, str))
        return _Kinds(raw=bool(strings), literals=strings, json=len(strings) < len(values))
    kind = schema.get("type")
    if kind == "string":
        return _Kinds(raw=True, literals=None, json=False)
    if isinstance(kind, list):
        return _Kinds(raw="string" in kind, literals=None, json=kind != ["string"])
    if kind is not None:
        return _Kinds(raw=False, literals=None, json=True)
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            branches = [_kinds(_resolve(s, defs), defs) for s in schema[key]]
            raw = [b for b in branches if b.raw]
            unrestricted = any(b.literals is None for b in raw)
            literals = None if unrestricted else tuple(v for b in raw for v in b.literals or ())
            return _Kinds(raw=bool(raw), literals=literals, json=any(b.json for b in branches))
    return _ANYTHING


def _resolve(schema: Any, defs: Mapping[str, Any]) -> Any:
    """Follow local `#/$defs/...` references (type decisions only; JSON values keep them)."""
    for _ in range(_MAX_REF_HOPS):
        ref = schema.get("$ref") if isinstance(schema, dict) else None
        if not isinstance(ref, str):
            return schema
        section, _, name = ref[2:].partition("/")
        if name not in defs.get(section, {}):
            return {}  # unresolvable here: decide nothing
        schema = defs[section][name]
    return schema


def _check_refs(node: Any) -> None:
    """Only `#/$defs/...` and `#/definitions/...` references survive moving a property's schema
    out of the arguments schema; anything else (`#`, a JSON pointer elsewhere) is refused."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if ref is not None and not (isinstance(ref, str) and ref.startswith(_LOCAL_REF_PREFIXES)):
            raise UnsupportedTag(f"reference {ref!r} in an arguments schema")
        for value in node.values():
            _check_refs(value)
    elif isinstance(node, list):
        for value in node:
            _check_refs(value)


def _with_defs(schema: Any, defs: Mapping[str, Any]) -> Any:
    """A property's schema carrying the arguments schema's definitions (its own win)."""
    if schema is None:
        return True
    if not isinstance(schema, dict) or not defs:
        return schema
    merged = dict(schema)
    for section, entries in defs.items():
        own = schema.get(section)
        merged[section] = {**entries, **own} if isinstance(own, dict) else dict(entries)
    return merged


def _open_ended(node: Format) -> bool:
    """Content whose end xgrammar finds only from the tag's end string."""
    kind = node.get("type")
    if kind in ("any_text", "triggered_tags", "token_triggered_tags", "any_tokens"):
        return True
    if kind == "sequence" and node.get("elements"):
        return _open_ended(node["elements"][-1])
    return False

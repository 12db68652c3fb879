"""Structured final answers: a pydantic model or JSON Schema -> `response_format`, validation, repair.

The schema is sent as `response_format={"type": "json_schema", ...}` so a server with a grammar
engine can constrain decoding, but the answer is validated here too: grammar engines do not
enforce every keyword (`minimum`, `pattern`, `minItems`, formats ...), and a server without
one enforces nothing. A reply that fails gets a bounded number of repair turns that quote the
errors; after that the run fails with `OutputValidationError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import pydantic
from sglang_ds41.encoding.special_tokens import Special

from .errors import AgentConfigError
from .schema import clean_model_schema, drop_defaulted_nulls, make_strict
from .validation import NotJSON, SchemaValidator, loads_strict

# `[ \t]*`, not `\s*`: with newlines on both sides of the capture the match backtracked in
# quadratic time on a reply of many newlines (16,000: 2.5 s)
_FENCE = re.compile(r"^```(?:json)?[ \t]*\n(.*?)\n?```$", re.DOTALL)


@dataclass(frozen=True)
class OutputSpec:
    """The expected shape of the final answer."""

    name: str
    schema: dict[str, Any]
    model: type[pydantic.BaseModel] | None = field(default=None, repr=False)
    strict: bool = True
    loose_schema: dict[str, Any] | None = field(default=None, repr=False)

    @classmethod
    def of(cls, output_type: Any, name: str | None = None) -> OutputSpec | None:
        """From a pydantic model class, a JSON Schema dict, or None (plain text)."""
        if output_type is None or output_type is str:
            return None
        if isinstance(output_type, OutputSpec):
            return output_type
        if isinstance(output_type, type) and issubclass(output_type, pydantic.BaseModel):
            where = f"output type {output_type.__name__}"
            loose = clean_model_schema(output_type.model_json_schema(), where)
            return cls(name or output_type.__name__, make_strict(loose), output_type, loose_schema=loose)
        if isinstance(output_type, dict | bool):
            return cls(name or "output", output_type, None, strict=False)  # type: ignore[arg-type]
        raise AgentConfigError(
            f"output_type must be a pydantic model class or a JSON Schema dict, got {output_type!r}"
        )

    def __post_init__(self) -> None:
        # Validated against its own schema (the model's, for a pydantic type), as declared.
        own = self.loose_schema if self.loose_schema is not None else self.schema
        object.__setattr__(self, "_validator", SchemaValidator.compile(own, f"output schema {self.name!r}"))

    def response_format(self) -> dict[str, Any]:
        return {
            "type": "json_schema",
            "json_schema": {"name": _safe_name(self.name), "schema": self.schema, "strict": self.strict},
        }

    def validate(self, content: str) -> tuple[Any, str | None]:
        """(value, None) when the content is a valid answer, else (None, a message for the model)."""
        text = content.strip()
        fenced = _FENCE.match(text)  # tolerate a ```json fence around an otherwise valid answer
        if fenced:
            text = fenced.group(1).strip()
        try:
            value = loads_strict(text)
        except NotJSON as error:
            return None, f"the reply is not valid JSON ({error})"
        if self.loose_schema is not None:
            value = drop_defaulted_nulls(value, self.loose_schema)
        problems = self._validator.problems(value)  # type: ignore[attr-defined]
        if problems:
            lines = [f"{_path(e)}: {e.message}" for e in problems[:5]]
            return None, "the reply does not match the schema: " + "; ".join(lines)
        if self.model is not None:
            try:
                return self.model.model_validate(value), None
            except pydantic.ValidationError as error:
                lines = [
                    f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in error.errors()[:5]
                ]
                return None, "the reply does not match the schema: " + "; ".join(lines)
        return value, None


def repair_prompt(problem: str) -> str:
    return (
        f"Your previous reply cannot be used: {problem}. "
        "Reply again with only the JSON value that matches the required schema."
    )


# A tool-call tag of the V4.1 format (docs/ENCODING.md §2.7), spaced or not: `<｜DSML｜ calls>`,
# `<｜DSML｜invoke`, `</｜DSML｜ parameter>`.
_CALL_MARKUP = re.compile(
    rf"</?\s*{re.escape(Special.DSML.value)}\s*(?:calls|tool_calls|invoke|parameter|function_calls)\b"
)
UNPARSED_CALLS = (
    "it holds tool-call markup as text: the server did not parse it as a call, so nothing ran"
)


def unparsed_calls(content: str) -> str | None:
    """Why a final answer is no answer: raw tool-call markup in `content` is a call the server
    returned unparsed (a server started without the V4.1 tool-call parser, or markup the
    parser refused), never something to hand the caller as the result."""
    return UNPARSED_CALLS if _CALL_MARKUP.search(content) else None


def calls_repair_prompt() -> str:
    return (
        f"Your previous reply cannot be used: {UNPARSED_CALLS}. If a tool call is still needed, "
        "make it as a tool call; otherwise reply with the answer alone."
    )


def to_jsonable(value: Any) -> Any:
    """A final output as plain JSON data (for the event log and the CLI)."""
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json")
    return value


def _path(error: jsonschema.ValidationError) -> str:
    return "/" + "/".join(map(str, error.absolute_path))


def _safe_name(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_-]", "_", name)[:64] or "output"

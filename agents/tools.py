"""Tools: plain Python functions exposed to the model with a schema derived from their signature.

`function_tool` reads type hints (through pydantic) and the docstring (summary + Google-style
`Args:` or `:param x:` lines) to build a JSON Schema; the model is shown its strict-mode normal
form (every property required, optional ones nullable), which is what the server's grammar
constrains. Calling a tool is split in two so the runner can log between them:
`Tool.prepare(arguments_text)` parses the model's JSON (NaN/Infinity refused) and validates it
against the tool's *own* schema, as its `$schema` declares (validation.py), so a call that omits an
optional argument is as correct as one that sends null for it; `Tool.invoke(kwargs, ctx)` runs the
function. Every problem becomes a short message for the model instead of an exception.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, get_type_hints

import jsonschema
import pydantic
import pydantic_core

from .errors import AgentConfigError
from .schema import clean_model_schema, drop_defaulted_nulls, make_strict
from .trust import EFFECTS, Effect
from .validation import NotJSON, SchemaValidator, loads_strict

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")  # what the DeepSeek renderer accepts (§2.1)
Isolation = Literal["process", "thread"]


@dataclass(frozen=True)
class ToolContext:
    """Passed to a tool that declares a parameter of this type (it is left out of the schema).

    `call_id` is stable across a crash and resume, so a tool can use it as an idempotency key.
    """

    call_id: str
    tool_name: str
    run_dir: str | None = None


@dataclass(frozen=True)
class PreparedCall:
    """A call whose arguments validated: ready to run. `arguments` is the model's parsed JSON."""

    call_id: str
    tool: Tool
    arguments: dict[str, Any]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Tool:
    """A function the model may call.

    `strict`: the schema is in strict-mode normal form (closed objects, every property required,
    optional ones nullable). `needs_approval`: the call runs only when the run's approval policy
    grants that exact call.
    `max_retries`: how many failed calls (bad arguments, exceptions, timeouts) the model gets
    before the run stops. `timeout_s`: overrides the run's per-tool timeout. `isolation`:
    "process" runs each call in a child process that can be killed at the timeout, at the price of
    the tool's in-memory side effects staying in the child; "thread" (or None with the default
    executor) runs it in this process. `idempotent`: safe to run again after a crash interrupted it
    (otherwise an interrupted call gets an explicit "interrupted" result and is never re-run).
    `effect` (read / write / network / messages / payments), `trusted_output`, `destinations`
    (the parameters that say where data, money or access goes: recipients, accounts, URLs),
    `content` (the parameters that are prose: a message body, a file's text), `private_output`
    (the output is the user's secrets: identity documents, card numbers) and `actions` (the
    words a user asks for this tool's effect with: "delete", "remove"; None: the words of the
    tool's name) feed the untrusted-content policy (trust.py): declaring an effect on any
    tool turns it on.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    strict: bool = True
    needs_approval: bool = False
    max_retries: int = 2
    timeout_s: float | None = None
    isolation: Isolation | None = None
    idempotent: bool = False
    effect: Effect | None = None
    trusted_output: bool | None = None
    destinations: tuple[str, ...] = ()
    content: tuple[str, ...] = ()
    private_output: bool = False
    actions: tuple[str, ...] | None = None
    loose_parameters: dict[str, Any] = field(default_factory=dict, repr=False)
    model: type[pydantic.BaseModel] | None = field(default=None, repr=False)
    context_param: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not TOOL_NAME.match(self.name):
            raise AgentConfigError(
                f"tool name {self.name!r} must match ^[a-zA-Z0-9_-]+$ and be 1-128 characters long"
            )
        if self.effect is not None and self.effect not in EFFECTS:
            raise AgentConfigError(
                f"tool {self.name!r}: effect must be one of {', '.join(EFFECTS)} or None, got {self.effect!r}"
            )
        for role in ("destinations", "content"):
            names = getattr(self, role)
            if not isinstance(names, tuple | list) or not all(isinstance(n, str) for n in names):
                raise AgentConfigError(
                    f"tool {self.name!r}: {role} must be a tuple of parameter names, got {names!r}"
                )
            object.__setattr__(self, role, tuple(names))
        if self.actions is not None:
            words = self.actions
            if isinstance(words, str) or not all(isinstance(a, str) and a.strip() for a in words):
                raise AgentConfigError(
                    f"tool {self.name!r}: actions must be a tuple of words, got {self.actions!r}"
                )
            object.__setattr__(self, "actions", tuple(self.actions))
        if self.isolation not in (None, "process", "thread"):
            raise AgentConfigError(
                f"tool {self.name!r}: isolation must be 'process', 'thread' or None, got {self.isolation!r}"
            )
        if not callable(self.fn):
            raise AgentConfigError(f"tool {self.name!r}: fn must be callable, got {type(self.fn).__name__}")
        if not isinstance(self.parameters, dict) or self.parameters.get("type") != "object":
            raise AgentConfigError(
                f"tool {self.name!r}: parameters must be an object schema "
                f'({{"type": "object", ...}}), got {_shown(self.parameters)}'
            )
        where = f"tool {self.name!r} parameters"
        properties = self.parameters.get("properties") or {}
        for role in ("destinations", "content"):
            unknown = [n for n in getattr(self, role) if n not in properties]
            if unknown:
                raise AgentConfigError(f"tool {self.name!r}: {role} {unknown} are not parameters of the tool")
        both = sorted(set(self.destinations) & set(self.content))
        if both:
            raise AgentConfigError(f"tool {self.name!r}: {both} cannot be both destinations and content")
        SchemaValidator.compile(self.parameters, where)  # what the model is shown must be sound too
        own = self.loose_parameters or self.parameters
        object.__setattr__(self, "_validator", SchemaValidator.compile(own, where))

    @property
    def own_schema(self) -> dict[str, Any]:
        """The schema arguments are validated against: the function's own, before strict
        normalisation (which only shapes what the server's grammar constrains)."""
        return self.loose_parameters or self.parameters

    def to_openai(self) -> dict[str, Any]:
        # No `"strict": true` flag: the schema is already in strict normal form, and the flag would
        # only make a DeepSeek server re-normalise it (dropping keywords such as minLength).
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": function}

    def prepare(self, call_id: str, arguments_text: str) -> PreparedCall | str:
        """Parse and validate the model's arguments; a `str` is the error to send back instead."""
        try:
            arguments = loads_strict(arguments_text) if arguments_text.strip() else {}
        except NotJSON as error:
            return f"Error: the arguments for {self.name} are not valid JSON ({error})."
        if not isinstance(arguments, dict):
            return (
                f"Error: the arguments for {self.name} must be a JSON object, got {type(arguments).__name__}."
            )
        # A null for an optional argument is how the strict schema says "the default".
        kwargs = (
            drop_defaulted_nulls(arguments, self.loose_parameters) if self.loose_parameters else arguments
        )
        problems = self._validator.problems(kwargs)  # type: ignore[attr-defined]
        if problems:
            lines = [f"- {_where(e)}: {e.message}" for e in problems[:5]]
            more = f"\n(and {len(problems) - 5} more)" if len(problems) > 5 else ""
            return f"Error: invalid arguments for {self.name}:\n" + "\n".join(lines) + more
        if self.model is not None:
            try:
                validated = self.model.model_validate(kwargs)
            except pydantic.ValidationError as error:
                lines = [
                    f"- {'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in error.errors()[:5]
                ]
                return f"Error: invalid arguments for {self.name}:\n" + "\n".join(lines)
            kwargs = {name: getattr(validated, name) for name in type(validated).model_fields}
        return PreparedCall(call_id, self, arguments, kwargs)

    def invoke(self, kwargs: dict[str, Any], ctx: ToolContext) -> Any:
        """Run the function (synchronously; coroutine functions are driven by the executor)."""
        if self.context_param is not None:
            kwargs = {**kwargs, self.context_param: ctx}
        return self.fn(**kwargs)


def _shown(value: Any) -> str:
    text = json.dumps(value, default=repr) if isinstance(value, dict) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _where(error: jsonschema.ValidationError) -> str:
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    return path.lstrip(".") or "(arguments)"


class ResultNotText(ValueError):
    """A tool's return value that cannot be written as JSON; the call counts as a failed one."""


def result_text(value: Any) -> str:
    """What the model sees for a tool's return value: text as is, anything else as JSON; always
    text that can be sent (`sendable`). A value JSON cannot hold (one that contains itself, nests
    past Python's recursion limit, an integer of over 4,300 digits, an object whose `str`
    raises) raises `ResultNotText`, which the executors report like any failed call."""
    if isinstance(value, str):
        return sendable(value)
    try:
        if isinstance(value, pydantic.BaseModel):
            return sendable(value.model_dump_json())
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = dataclasses.asdict(value)
        return sendable(json.dumps(value, ensure_ascii=False, default=str))
    except Exception as error:
        raise ResultNotText(f"the result cannot be written as JSON ({error_line(error)[:200]})") from None


def error_line(error: BaseException) -> str:
    """An exception as one short line, its type and the first line of its message (the type
    alone when the message is empty or cannot be made: its `__str__` raises, ValueError(10**5000))."""
    try:
        text = str(error).strip()
    except Exception:
        text = ""
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def sendable(text: str) -> str:
    """`text` with every lone surrogate written as its escape (`\\udcff`), so that it encodes as
    UTF-8: Python hands out such strings for bytes that are not UTF-8 (a file name listed
    with `os.listdir`), and one in a tool result would fail the request to the model (and the
    run log) with an encoding error. Text without them is returned as it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def function_tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    strict: bool = True,
    needs_approval: bool = False,
    max_retries: int = 2,
    timeout_s: float | None = None,
    isolation: Isolation | None = None,
    idempotent: bool = False,
    effect: Effect | None = None,
    trusted_output: bool | None = None,
    destinations: Sequence[str] = (),
    content: Sequence[str] = (),
    private_output: bool = False,
    actions: Sequence[str] | None = None,
) -> Any:
    """Make a `Tool` from a function; usable as `@function_tool` or `@function_tool(...)`."""

    def build(func: Callable[..., Any]) -> Tool:
        summary, param_docs = parse_docstring(inspect.getdoc(func) or "")
        tool_name = name if name is not None else func.__name__
        model, context_param = _arguments_model(func, tool_name, param_docs)
        loose = clean_model_schema(model.model_json_schema(), f"tool {tool_name!r}")
        loose.pop("description", None)
        return Tool(
            name=tool_name,
            description=description if description is not None else summary,
            parameters=make_strict(loose) if strict else loose,
            fn=func,
            strict=strict,
            needs_approval=needs_approval,
            max_retries=max_retries,
            timeout_s=timeout_s,
            isolation=isolation,
            idempotent=idempotent,
            effect=effect,
            trusted_output=trusted_output,
            destinations=destinations,  # type: ignore[arg-type]  (Tool checks and converts)
            content=content,  # type: ignore[arg-type]
            private_output=private_output,
            actions=actions,  # type: ignore[arg-type]
            loose_parameters=loose,
            model=model,
            context_param=context_param,
        )

    return build(fn) if fn is not None else build


def _arguments_model(
    func: Callable[..., Any], tool_name: str, param_docs: dict[str, str]
) -> tuple[type[pydantic.BaseModel], str | None]:
    try:
        hints = get_type_hints(func, include_extras=True)  # keep Annotated[..., Field(...)] constraints
    except Exception as error:  # unresolvable forward references
        raise AgentConfigError(f"tool {tool_name!r}: cannot read type hints ({error})") from None
    fields: dict[str, Any] = {}
    context_param = None
    for pname, param in inspect.signature(func).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise AgentConfigError(f"tool {tool_name!r}: *args/**kwargs cannot be described to the model")
        annotation = hints.get(pname, Any)
        if _unannotated(annotation) is ToolContext:
            context_param = pname
            continue
        if pname not in hints:
            raise AgentConfigError(f"tool {tool_name!r}: parameter {pname!r} needs a type hint")
        default = ... if param.default is param.empty else param.default
        # The docstring's description only when it has one: a Field(description=None) here would
        # override an Annotated[..., Field(description=...)].
        documented = {"description": param_docs[pname]} if pname in param_docs else {}
        fields[pname] = (annotation, pydantic.Field(default, **documented))
    try:
        model = pydantic.create_model(
            f"{tool_name}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields
        )
    except (pydantic.PydanticUserError, pydantic_core.SchemaError, TypeError, ValueError) as error:
        reason = (str(error).strip().splitlines() or [""])[-1].strip()  # pydantic's last line is the cause
        hint = _PATTERN_HINT if "regex" in str(error) else ""
        problem = f"tool {tool_name!r}: pydantic cannot build its arguments ({reason}){hint}"
        raise AgentConfigError(problem) from None
    return model, context_param


_PATTERN_HINT = (
    "; a pattern pydantic's regex engine cannot read can be declared as"
    " Field(json_schema_extra={'pattern': ...}): the runner checks it as ECMA-262 before the call"
)


def _unannotated(annotation: Any) -> Any:
    """`Annotated[T, ...]` -> T (hints are read with their metadata, `include_extras`)."""
    return typing.get_args(annotation)[0] if typing.get_origin(annotation) is Annotated else annotation


_SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns|Raises|Yields|Examples?|Notes?):\s*$")
_GOOGLE_ARG = re.compile(r"^(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_ARG = re.compile(r"^:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Summary (text before the first section) and per-parameter descriptions."""
    summary: list[str] = []
    params: dict[str, str] = {}
    section = None
    current = None
    arg_indent = None
    for raw in doc.splitlines():
        line = raw.strip()
        indent = len(raw) - len(raw.lstrip())
        header = _SECTION.match(line)
        if header:
            section, current, arg_indent = header.group(1), None, None
            continue
        sphinx = _SPHINX_ARG.match(line)
        if sphinx:
            current = sphinx.group(1)
            params[current] = sphinx.group(2).strip()
            section = "sphinx"
            continue
        if section is None:
            if not line.startswith(":"):
                summary.append(line)
            continue
        if section in ("Args", "Arguments", "Parameters"):
            match = _GOOGLE_ARG.match(line)
            if match and (arg_indent is None or indent <= arg_indent):
                arg_indent = indent
                current = match.group(1).lstrip("*")
                params[current] = match.group(3).strip()
            elif current and line:
                params[current] = f"{params[current]} {line}".strip()
        elif section == "sphinx" and current and line and not line.startswith(":"):
            params[current] = f"{params[current]} {line}".strip()
    return " ".join(" ".join(summary).split()), params

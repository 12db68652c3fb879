"""Load an agent for the CLI: `pkg.mod:attr` (an Agent, or a function returning one) or a
YAML/JSON spec file.

Spec keys: `name`, `instructions`, `model`, `tools` (import paths `pkg.mod:attr` of `Tool`s or
plain functions), `workspace` (`{root, writable, max_file_bytes}`: the bundled file tools),
`output_schema` (JSON Schema), `thinking`, `reasoning_effort`, `thinking_token_budget`,
`tool_choice`, `model_settings`,
`limits` (fields of `Limits`), `approve` (a list of `{name, arguments}` exact calls to grant),
`max_output_repairs`, `input` (the default user message). Relative paths are relative to the
spec file, and tool modules are found beside it first (`weather_calculator:get_weather` names
weather_calculator.py in the spec's folder).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

from .agent import Agent
from .errors import AgentConfigError
from .policies import ApproveCalls, Limits, Policies
from .tools import Tool, function_tool
from .workspace_tools import workspace_tools

SPEC_KEYS = {
    "name",
    "instructions",
    "model",
    "tools",
    "workspace",
    "output_schema",
    "thinking",
    "reasoning_effort",
    "thinking_token_budget",
    "tool_choice",
    "model_settings",
    "limits",
    "approve",
    "max_output_repairs",
    "input",
}


def import_object(path: str, beside: Path | None = None) -> Any:
    """`package.module:attribute`; with `beside` (a spec file's folder), modules there come first,
    so a spec and its tool module work from any current directory."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise AgentConfigError(f"{path!r}: expected an import path of the form package.module:attribute")
    folder = str(beside.resolve()) if beside is not None else None
    try:
        if folder is not None and folder not in sys.path:
            sys.path.insert(0, folder)
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise AgentConfigError(f"{path!r}: cannot import {module_name} ({error})") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise AgentConfigError(f"{path!r}: module {module_name} has no attribute {attr!r}") from None


def load_agent(spec: str) -> tuple[Agent, str | None]:
    """(agent, default input) from a module path or a spec file."""
    if spec.endswith((".yaml", ".yml", ".json")) or Path(spec).is_file():
        return _from_file(Path(spec))
    obj = import_object(spec)
    if callable(obj) and not isinstance(obj, Agent):
        try:
            obj = obj()
        except TypeError as error:
            raise AgentConfigError(
                f"{spec!r}: expected an Agent or a function returning one ({error})"
            ) from None
    if not isinstance(obj, Agent):
        raise AgentConfigError(
            f"{spec!r} is a {type(obj).__name__}, expected an Agent (or a function returning one)"
        )
    return obj, None


def _from_file(path: Path) -> tuple[Agent, str | None]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise AgentConfigError(f"cannot read agent spec {path}: {error.strerror}") from None
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as error:
        raise AgentConfigError(
            f"{path}: not valid {path.suffix.lstrip('.').upper() or 'YAML'}: {error}"
        ) from None
    if not isinstance(data, dict):
        raise AgentConfigError(f"{path}: an agent spec must be a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - SPEC_KEYS)
    if unknown:
        raise AgentConfigError(f"{path}: unknown keys {unknown}; allowed: {sorted(SPEC_KEYS)}")
    if "name" not in data:
        raise AgentConfigError(f"{path}: the spec needs a 'name'")
    tools: list[Tool] = []
    for entry in data.get("tools") or []:
        obj = import_object(entry, beside=path.parent)
        tools.append(obj if isinstance(obj, Tool) else function_tool(obj))
    workspace = data.get("workspace")
    if workspace:
        if not isinstance(workspace, dict) or "root" not in workspace:
            raise AgentConfigError(
                f"{path}: 'workspace' must be a mapping with a 'root', got {repr(workspace)[:200]}"
            )
        root = (path.parent / workspace["root"]).resolve()
        tools += workspace_tools(
            root,
            writable=workspace.get("writable", True),
            max_file_bytes=workspace.get("max_file_bytes", 1 << 20),
        )
    try:
        limits = Limits(**(data.get("limits") or {}))
    except TypeError as error:
        raise AgentConfigError(f"{path}: bad 'limits': {error}") from None
    granted = [(item["name"], item.get("arguments", {})) for item in data.get("approve") or []]
    kwargs = {
        k: data[k]
        for k in (
            "instructions",
            "model",
            "thinking",
            "reasoning_effort",
            "thinking_token_budget",
            "tool_choice",
            "model_settings",
            "max_output_repairs",
        )
        if k in data
    }
    agent = Agent(
        name=data["name"],
        tools=tools,
        output_type=data.get("output_schema"),
        policies=Policies(limits=limits, approval=ApproveCalls(granted)),
        **kwargs,
    )
    return agent, data.get("input")

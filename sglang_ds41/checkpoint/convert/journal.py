"""DST's record of a conversion: the finished output shards (sizes and the quality statistics of
their rows), so a rerun after a kill skips them; and the kill points the crash tests use."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

from sglang_ds41.checkpoint.convert.errors import ConvertError
from sglang_ds41.checkpoint.convert.plan import Plan, Shard
from sglang_ds41.checkpoint.convert.quality import Quality
from sglang_ds41.checkpoint.st_writer import OutputError, PWrite, describe_os_error, write_bytes_atomic
from sglang_ds41.formats.engram import FP8, MXFP4

JOURNAL = ".convert-engram.json"
JOURNAL_KIND = "sglang-ds41 convert-engram journal v1"
# Test hook: "chunk:N" / "commit:N" / "journal:N" SIGKILLs this process right after the N-th
# written chunk, shard rename, or journal update -- the points a real crash can fall between.
KILL_ENV = "SGLANG_DS41_CONVERT_KILL_AT"


class Journal:
    """DST's record of finished output shards, rewritten atomically after each one."""

    def __init__(self, plan: Plan, pwrite: PWrite):
        self.path = plan.dst / JOURNAL
        self.plan = plan
        self.pwrite = pwrite
        self.data: dict[str, Any] = {
            "kind": JOURNAL_KIND,
            **plan.journal_key,
            "complete": False,
            "shards": {},
        }

    def load_or_start(self) -> None:
        """Adopt DST's journal if it is this conversion's; refuse any other non-empty DST."""
        dst = self.plan.dst
        if dst.exists() and not dst.is_dir():
            raise ConvertError(f"DST_DIR {dst} exists and is not a directory")
        entries = sorted(p.name for p in dst.iterdir()) if dst.is_dir() else []
        if self.path.is_file():
            try:
                old = json.loads(self.path.read_text())
            except (OSError, ValueError) as error:
                raise ConvertError(f"{self.path}: unreadable conversion journal ({error})") from None
            if "scale_rule" not in old and old.get("to") in _RULE_BEFORE_RULES:
                old["scale_rule"] = _RULE_BEFORE_RULES[old["to"]]  # journals from before the choice
            key = {k: old.get(k) for k in self.plan.journal_key}
            if old.get("kind") != JOURNAL_KIND or key != self.plan.journal_key:
                raise ConvertError(
                    f"DST_DIR {dst} holds a different conversion (source {old.get('source')!r}, "
                    f"to {old.get('to')!r}, scale rule {old.get('scale_rule')!r}, layers "
                    f"{old.get('layers')}) than this one (source {str(self.plan.src)!r}, to "
                    f"{self.plan.to!r}, scale rule {self.plan.scale_rule!r}, layers "
                    f"{key_layers(self.plan)}) or the source changed since; use an empty DST_DIR"
                )
            self.data = old
        elif entries:
            raise ConvertError(
                f"DST_DIR {dst} is not empty ({', '.join(entries[:5])}{', ...' if len(entries) > 5 else ''}) "
                f"and holds no {JOURNAL} of this conversion; use an empty or new directory"
            )
        else:
            try:
                dst.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise OutputError(describe_os_error(error, dst)) from None
            self.save()

    @property
    def complete(self) -> bool:
        return bool(self.data.get("complete"))

    def finished(self, shard: Shard) -> bool:
        entry = self.data["shards"].get(shard.file)
        path = self.plan.dst / shard.file
        return (
            bool(entry)
            and entry.get("size") == shard.size
            and path.is_file()
            and path.stat().st_size == shard.size
        )

    def record(self, shard: Shard, quality: dict[int, Quality]) -> None:
        self.data["shards"][shard.file] = {
            "size": shard.size,
            "quality": {str(layer): q.to_json() for layer, q in sorted(quality.items())},
        }
        self.save()

    def quality(self) -> dict[int, Quality]:
        """Per table, the statistics of every finished shard merged (in shard order)."""
        out: dict[int, Quality] = {}
        for file in sorted(self.data["shards"]):
            for layer, q in self.data["shards"][file].get("quality", {}).items():
                out[int(layer)] = out.get(int(layer), Quality()).merge(Quality.from_json(q))
        return out

    def save(self) -> None:
        text = json.dumps(self.data, indent=1, sort_keys=False) + "\n"
        write_bytes_atomic(self.path, text.encode(), self.pwrite)
        kill_point("journal")


# What a journal written before `--scale-rule` existed converted with.
_RULE_BEFORE_RULES = {MXFP4.name: "ocp", FP8.name: "exact"}


def key_layers(plan: Plan) -> list[int]:
    return [t.layer for t in plan.tables]


_kill_counts: dict[str, int] = {}


def kill_point(event: str) -> None:
    """The kill-at hook (see KILL_ENV); a no-op unless the variable is set."""
    spec = os.environ.get(KILL_ENV)
    if not spec:
        return
    kind, _, n = spec.partition(":")
    if kind != event:
        return
    _kill_counts[event] = _kill_counts.get(event, 0) + 1
    if _kill_counts[event] >= int(n):
        os.kill(os.getpid(), signal.SIGKILL)

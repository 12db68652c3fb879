"""The special tokens the V4.1 renderer emits and the parser consumes (ENCODING.md §1.1).

Spellings use U+FF5C (｜) and U+2581 (▁). Ids are those of the V4.1 checkpoint tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Special(StrEnum):
    """A special token kind; the value is its V4.1 checkpoint spelling."""

    BOS = "<｜begin▁of▁sentence｜>"
    EOS = "<｜end▁of▁sentence｜>"
    SYSTEM = "<｜System｜>"
    USER = "<｜User｜>"
    ASSISTANT = "<｜Assistant｜>"
    THINK_START = "<think>"
    THINK_END = "</think>"
    DSML = "｜DSML｜"
    LATEST_REMINDER = "<｜latest_reminder｜>"
    IMAGE = "<｜deepseek_image｜>"

    @property
    def id(self) -> int:
        return SPECIAL_IDS[self]


SPECIAL_IDS: dict[Special, int] = {
    Special.BOS: 0,
    Special.EOS: 1,
    Special.SYSTEM: 128799,
    Special.USER: 128803,
    Special.ASSISTANT: 128804,
    Special.THINK_START: 128821,
    Special.THINK_END: 128822,
    Special.DSML: 128825,
    Special.LATEST_REMINDER: 128828,
    Special.IMAGE: 129264,
}

PAD_ID = 2


@dataclass(frozen=True)
class SpecialSpan:
    """A code-point range [start, end) of a rendered prompt that is one special token."""

    start: int
    end: int
    token: Special

"""A training run's settings (`settings.json` of the run directory); no torch needed to read them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sglang_ds41.config import V41Config
from sglang_ds41.errors import Ds41Error

from .config import trained_config


@dataclass(frozen=True)
class Settings:
    seed: int = 0
    steps: int = 1500
    batch_tokens: int = 4096  # padded tokens per step
    max_len: int = 1024  # longer samples are skipped (every ratio-1 layer then sees all entries)
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int = 60
    weight_decay: float = 0.05
    clip: float = 1.0
    bias_rate: float = 1e-3
    qat_from: float = 0.25  # fraction of the steps after which weights are rounded like the checkpoint
    copy_first: int = 10000  # conversations drawn from the copy-heavy mix first (corpus.tasks.COPY_FIRST)
    drill_warmup: int = 0  # the first steps train on copy drills only (drills.py)
    drill_every: int = 0  # then every n-th step is a drill step (0 = none)
    drill_share: float = 0.0  # then each corpus step also learns from drills of this share of its tokens
    periodic_drills: float = 0.5  # the share of drills that repeat one segment to the end (drills.py)
    spelling_drills: float = 0.0  # the share of drills that spell words without their space (spelling.py)
    spelling_lead: int = 0  # the most lower-case words before a spelling drill's word (spelling.py)
    spelling_gap: int = 12  # the most lower-case words between the word and its spelling (spelling.GAP)
    spelling_tail: int = 0  # the most pieces after a spelling drill's word and its spelling (spelling.py)
    name_drills: float = 0.0  # the share of drills that are call turns writing drilled words (name_drills.py)
    vocabulary_names: float = 0.0  # the share of made-up names that are capitalised words (corpus.pools)
    embed_std: float = 0.0884  # 1/sqrt(128): unit-scale logits at the start
    save_every: int = 50
    text: dict[str, Any] = dataclasses.field(default_factory=dict)  # overrides of config.TRAINED_TEXT
    # A continued run (`Run.continue_from`): the step it started from, its source's settings and
    # the seconds of the steps behind that step (`train_seconds`, the source's sources included).
    continued_from: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for name in SHARES:
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise Ds41Error(
                    f"training setting {name} ({flag(name)}) is a share: expected 0 to 1, got {value}"
                )
        if self.spelling_drills + self.name_drills > 1.0:
            raise Ds41Error(
                f"training settings spelling_drills and name_drills ({flag('spelling_drills')}, "
                f"{flag('name_drills')}) are shares of the same drills: expected a sum of at most 1, "
                f"got {self.spelling_drills} + {self.name_drills}"
            )

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Settings:
        """The settings of a `settings.json`; a setting added after the file was written takes
        the value that reproduces what runs did before it existed, not today's default."""
        return cls(**(ADDED_LATER | record))

    def config(self) -> V41Config:
        return V41Config.from_dict(trained_config(text=self.text), source="training settings")


def flag(name: str) -> str:
    """The `train-tiny` flag that sets the setting `name`."""
    return "--" + name.replace("_", "-")


# The settings that are a share of something (of drills, of a batch, of names): 0 to 1.
SHARES = ("drill_share", "periodic_drills", "spelling_drills", "name_drills", "vocabulary_names")

# What runs did before these settings existed (their files lack them).
ADDED_LATER: dict[str, Any] = {
    "drill_share": 0.0,
    "periodic_drills": 0.5,
    "spelling_drills": 0.0,
    "spelling_lead": 0,
    "spelling_gap": 12,
    "spelling_tail": 0,
    "name_drills": 0.0,
    "vocabulary_names": 0.0,
    "continued_from": None,
}

# What a continued run may change: how long it runs and what it trains on, not the model, the
# data stream or the optimizer (those make it the same run, carried on).
CONTINUABLE = (
    "steps", "drill_warmup", "drill_every", "drill_share", "periodic_drills", "spelling_drills",
    "spelling_lead", "spelling_gap", "spelling_tail", "name_drills", "vocabulary_names",
)  # fmt: skip

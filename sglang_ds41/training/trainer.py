"""Train the tiny V4.1 on the synthetic corpus: float32, AdamW, reproducible, resumable.

    run = Run.create(run_dir, Settings(...))   # or Run.resume(run_dir),
                                               # or Run.continue_from(source_dir, run_dir, steps=...)
    run.train()                                # tqdm bar with the loss; progress.jsonl beside it
    run.export(out_dir)                        # the official checkpoint layout (`export.py`)

The run directory holds `settings.json`, `state.pt` (model, Engram tables, optimizer, the
live vocabulary rows, RNG and data positions; written atomically every `save_every` steps and
at the end) and `progress.jsonl` (one line per step: loss, learning rate, tokens, and the
step's wall seconds, making its batch included).
Everything random comes from the seed: initial values (`init.py`), the rows of new ids
(`vocab.py`) and the corpus (`data.py`), so a run resumed from any save point ends with the same
weights as one that was never interrupted. A continued run (`continue_from`) is a finished or
saved run carried on in a new directory with more steps or other drills, so a longer schedule
can be tried without training again what the source already trained.

The router bias is trained the V4.1 way (no auxiliary loss): after every step each layer's
bias moves by `bias_rate` towards the experts that got fewer tokens than average.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch

from sglang_ds41.assets import TOKENIZER_JSON
from sglang_ds41.checkpoint.manifest import build_manifest
from sglang_ds41.engram.hashing import EngramHasher
from sglang_ds41.errors import Ds41Error
from sglang_ds41.reference.model import Transformer

from .data import IGNORE, batches
from .drills import drill_batch, is_drill_step
from .forward import Batch, EngramTables, forward_hidden
from .init import initialise
from .quant import round_like_checkpoint, round_rows, set_rounding
from .settings import CONTINUABLE, Settings
from .vocab import LiveRows, VocabRows, full_vocab_cross_entropy, step_with_live_rows

SETTINGS_FILE, STATE_FILE, PROGRESS_FILE = "settings.json", "state.pt", "progress.jsonl"


class Run:
    def __init__(self, run_dir: Path, settings: Settings):
        self.dir, self.settings = run_dir, settings
        self.config = settings.config()
        text = self.config.text
        self.hasher = EngramHasher.for_tokenizer(self.config, TOKENIZER_JSON)
        generator = torch.Generator().manual_seed(settings.seed)
        self.model = Transformer(self.config, self.hasher)
        initialise(self.model, generator)
        self.tables = EngramTables(
            tuple(text.engram_layer_ids), tuple(text.engram_num_embeddings), text.engram_head_dim
        )
        self.vocab = VocabRows(text.vocab_size, settings.embed_std, generator)
        round_like_checkpoint(self.model, build_manifest(self.config))
        self.optimizer = torch.optim.AdamW(self._groups(), lr=settings.lr, betas=(0.9, 0.95), eps=1e-8)
        self.step, self.position = 0, (0, 0)
        self._loads: dict[int, torch.Tensor] = {}
        # The tied matrix's gradient, kept from step to step (LiveRows.gradient).
        self._embed_grad = torch.zeros(text.vocab_size, text.hidden_size)
        for block in self.model.layers:
            block.ffn.gate.register_forward_hook(self._count_load(block.layer))

    # ---- creation ---------------------------------------------------------------------------

    @classmethod
    def create(cls, run_dir: str | Path, settings: Settings) -> Run:
        run_dir = Path(run_dir)
        if (run_dir / STATE_FILE).exists():
            raise Ds41Error(f"{run_dir} already holds a training run; resume it or choose another directory")
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / SETTINGS_FILE).write_text(json.dumps(dataclasses.asdict(settings), indent=2) + "\n")
        return cls(run_dir, settings)

    @classmethod
    def resume(cls, run_dir: str | Path) -> Run:
        run_dir = Path(run_dir)
        settings = _read_settings(run_dir)
        run = cls(run_dir, settings)
        if (run_dir / STATE_FILE).exists():
            run._load(torch.load(run_dir / STATE_FILE, weights_only=False))
        elif settings.continued_from is not None:
            raise Ds41Error(
                f"{run_dir}: a continued run without its {STATE_FILE} (interrupted while it was being "
                "made); remove the directory and continue the source run again"
            )
        return run

    @classmethod
    def continue_from(cls, source_dir: str | Path, run_dir: str | Path, **changes: Any) -> Run:
        """A new run in `run_dir` that carries on `source_dir`'s run from its saved step with some
        of its settings changed (`settings.CONTINUABLE`: more steps, other drills): its weights,
        optimizer moments, step counter and corpus place, so the schedule of the longer run
        continues and no conversation is seen twice. The source is read, never written; the new
        run records the step and the source's settings (`Settings.continued_from`)."""
        source_dir, run_dir = Path(source_dir), Path(run_dir)
        unknown = sorted(set(changes) - set(CONTINUABLE))
        if unknown:
            allowed = ", ".join(CONTINUABLE)
            raise Ds41Error(f"a continued run can change only {allowed}; got {', '.join(unknown)}")
        if not (source_dir / STATE_FILE).exists():
            raise Ds41Error(f"{source_dir}: no {STATE_FILE}; nothing to continue from")
        settings = _read_settings(source_dir)
        state = torch.load(source_dir / STATE_FILE, weights_only=False)
        step, steps = state["step"], changes.get("steps", settings.steps)
        if steps <= step:
            raise Ds41Error(
                f"{source_dir} is at step {step}; a continued run needs --steps above it, got {steps}"
            )
        record = {
            "step": step,
            "settings": dataclasses.asdict(settings),
            "train_seconds": round(_lineage_seconds(source_dir, settings, step), 1),
        }
        run = cls.create(run_dir, dataclasses.replace(settings, **changes, continued_from=record))
        run._load(state)
        run.save()
        return run

    def _groups(self) -> list[dict[str, Any]]:
        decay, plain = [], []
        for name, p in self.model.named_parameters():
            is_matrix = p.ndim == 2 and "embed" not in name and not name.endswith(("q_weight", "k_weight"))
            (decay if is_matrix else plain).append(p)
        plain += list(self.tables.parameters())
        return [
            {"params": decay, "weight_decay": self.settings.weight_decay},
            {"params": plain, "weight_decay": 0.0},
        ]

    # ---- training ---------------------------------------------------------------------------

    def lr_at(self, step: int) -> float:
        s = self.settings
        if step < s.warmup:
            return s.lr * (step + 1) / s.warmup
        progress = min(1.0, (step - s.warmup) / max(1, s.steps - s.warmup))
        return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))

    def train(self, progress_bar: bool = True, until: int | None = None) -> None:
        """Train to `settings.steps` (or stop after step `until`), saving every `save_every`."""
        from tqdm import tqdm

        s = self.settings
        last = s.steps if until is None else min(until, s.steps)
        stream = batches(
            s.seed,
            s.batch_tokens,
            s.max_len,
            self.hasher,
            start=self.position,
            copy_first=s.copy_first,
            vocabulary_names=s.vocabulary_names,
        )
        bar = tqdm(
            total=s.steps, initial=self.step, disable=not progress_bar, unit="step", dynamic_ncols=True
        )
        with open(self.dir / PROGRESS_FILE, "a") as log:
            while self.step < last:
                started = time.perf_counter()
                drilling = is_drill_step(self.step, s.drill_warmup, s.drill_every)
                if drilling:
                    batch = self._drills(s.batch_tokens)
                else:
                    packed = next(stream)
                    batch = packed.batch
                    if s.drill_share > 0:
                        batch = batch.join(self._drills(round(s.drill_share * s.batch_tokens)))
                batch = batch.by_length()  # like lengths attend together (forward.length_groups)
                loss, n_tokens = self.optimize(batch)
                if not drilling:
                    self.position = (packed.window_start, packed.in_window + 1)
                record = {
                    "step": self.step,
                    "loss": round(loss, 5),
                    "drill": drilling,
                    "lr": self.optimizer.param_groups[0]["lr"],
                    "tokens": n_tokens,
                    "learnt": int((batch.targets != IGNORE).sum()),
                    "vocab": int(self.vocab.active.sum()),
                    "s": round(time.perf_counter() - started, 3),
                }
                log.write(json.dumps(record) + "\n")
                log.flush()
                bar.set_postfix(loss=f"{loss:.3f}", vocab=record["vocab"])
                bar.update(1)
                if self.step % s.save_every == 0 or self.step == last:
                    self.save()
        bar.close()

    def _drills(self, tokens: int) -> Batch:
        """This step's drills (`drills.drill_batch`), about `tokens` of them."""
        s = self.settings
        return drill_batch(
            s.seed, self.step, tokens, self.hasher, self.config.bos_token_id, s.periodic_drills,
            s.spelling_drills, s.spelling_lead, s.spelling_gap, s.spelling_tail, s.name_drills,
        )  # fmt: skip

    def optimize(self, batch) -> tuple[float, int]:
        """One optimizer step on `batch` at the schedule's learning rate; advances `step`.
        Returns the loss and the batch's token count. `train` feeds it the corpus and drills;
        a diagnostic may feed it anything (benchmarks/copy_circuit.py)."""
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(self.step)
        rounding = self.step >= self.settings.qat_from * self.settings.steps
        set_rounding(self.model, rounding)
        self.tables.rounding = rounding
        embed = self.model.embed.parametrizations.weight.original
        self.vocab.activate(embed, batch.ids)
        live = LiveRows(embed, self.vocab.ids, functools.partial(round_rows, self.model.embed))
        embed_ids = functools.partial(self.input_embeddings, live)
        hidden = forward_hidden(self.model, self.tables, batch, embed=embed_ids)
        learn = batch.targets != IGNORE
        loss = full_vocab_cross_entropy(hidden[learn], live.rows, batch.targets[learn], live.position)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        live.gradient(self._embed_grad)
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(params, self.settings.clip)
        step_with_live_rows(self.optimizer, embed, live.ids)
        self._update_router_bias()
        self.step += 1
        return float(loss.detach()), int(batch.ids.numel())

    def input_embeddings(self, live: LiveRows, ids: torch.Tensor) -> torch.Tensor:
        """A step's input embeddings of `ids` (a diagnostic may wrap this: benchmarks/copy_circuit.py)."""
        return live.embed(ids)

    def _count_load(self, layer: int):
        def hook(module, inputs, output) -> None:
            ids = output[1]
            counts = torch.bincount(ids.flatten(), minlength=module.bias.numel()).float()
            self._loads[layer] = self._loads.get(layer, 0) + counts

        return hook

    @torch.no_grad()
    def _update_router_bias(self) -> None:
        for block in self.model.layers:
            load = self._loads.pop(block.layer, None)
            if load is None:
                continue
            bias = block.ffn.gate.bias
            bias.add_(self.settings.bias_rate * torch.sign(load.mean() - load))

    def progress(self) -> list[dict[str, Any]]:
        """The progress records of the steps this run holds (`progress_records`)."""
        return progress_records(self.dir, self.step)

    def lineage_seconds(self) -> float:
        """Seconds of the steps behind this run's state, its sources' included."""
        return _lineage_seconds(self.dir, self.settings, self.step)

    # ---- state ------------------------------------------------------------------------------

    def save(self) -> None:
        state = {
            "step": self.step,
            "position": self.position,
            "model": self.model.state_dict(),
            "tables": self.tables.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "vocab": self.vocab.state_dict(),
        }
        tmp = self.dir / (STATE_FILE + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.dir / STATE_FILE)

    def _load(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.tables.load_state_dict(state["tables"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.vocab.load_state_dict(state["vocab"])
        self.step, self.position = state["step"], tuple(state["position"])


def _read_settings(run_dir: Path) -> Settings:
    try:
        return Settings.from_record(json.loads((run_dir / SETTINGS_FILE).read_text()))
    except FileNotFoundError:
        raise Ds41Error(f"{run_dir}: no {SETTINGS_FILE}; not a training run directory") from None


def progress_records(run_dir: Path, step: int) -> list[dict[str, Any]]:
    """`run_dir`'s progress records of its first `step` steps (a record's `step` counts the steps
    done with it), one per step: a step done again after a resume (the log runs past the last
    save when a run is stopped) keeps its last record."""
    path = Path(run_dir) / PROGRESS_FILE
    by_step: dict[int, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                if record["step"] <= step:
                    by_step[record["step"]] = record
    return [by_step[k] for k in sorted(by_step)]


def _lineage_seconds(run_dir: Path, settings: Settings, step: int) -> float:
    """Seconds of `run_dir`'s own first `step` steps plus those its source recorded when it was
    continued (`Settings.continued_from["train_seconds"]`; absent in records older than it)."""
    own = sum(record["s"] for record in progress_records(run_dir, step))
    source = (settings.continued_from or {}).get("train_seconds", 0.0)
    return own + source

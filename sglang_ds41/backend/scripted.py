"""A test-only model whose output is scripted, served by the real SGLang server.

It ignores its weights and emits the token sequences of the scripts its checkpoint carries
(`checkpoint/scripted.py` writes them, as token ids in config.json's `SCRIPT_FIELD`); SGLang's
registry imports this module in every scheduler process, so it holds the model and how it plays
a script, nothing else.

What it emits depends only on the request's whole token sequence (read back through a
per-KV-slot copy of the token ids), so it survives chunked prefill and radix prefix hits:

* the generation starts after the last `<｜Assistant｜>` and its `<think>`/`</think>` token;
* the script is the first one whose trigger ids occur after the last `<｜User｜>` (tool
  results are user turns too, so an agent loop gets the default reply after a tool call),
  else the default script;
* after `<think>` it writes the script's reasoning, `</think>`, then its content; after
  `</think>` only the content; then EOS. A `</think>` that cuts the reasoning short (a server's
  thinking token budget forces one) is followed by the content too. Anything else that leaves
  the script (a forced prefix it does not match, a prompt without `<｜Assistant｜>`) gets EOS;
* a script with follow-up turns (`then`) drives a whole agent loop: when no trigger is in the
  last user turn but a script's trigger occurs earlier, the n-th assistant turn after the
  trigger's first occurrence writes `then[n - 1]` (past the end: the default script). Scripts
  without `then` keep the one-turn behaviour, so a plain tool loop ends with the default.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from sglang_ds41.backend.architectures import SCRIPT_FIELD
from sglang_ds41.encoding.special_tokens import Special
from sglang_ds41.errors import Ds41Error


def _find(seq: Sequence[int], sub: Sequence[int], start: int = 0) -> int:
    n = len(sub)
    for i in range(start, len(seq) - n + 1):
        if list(seq[i : i + n]) == list(sub):
            return i
    return -1


def _last(seq: Sequence[int], token: int) -> int:
    for i in range(len(seq) - 1, -1, -1):
        if seq[i] == token:
            return i
    return -1


def _answer(seq: Sequence[int], assistant: int, scripts: Sequence[dict]) -> dict:
    """The script turn (reasoning_ids, content_ids) for the assistant turn opened at `assistant`."""
    default = next(s for s in scripts if s["trigger_ids"] is None)
    user = _last(seq[:assistant], Special.USER.id)
    turn = seq[user + 1 : assistant] if user >= 0 else seq[:assistant]
    for script in scripts:
        if script["trigger_ids"] and _find(turn, script["trigger_ids"]) >= 0:
            return script
    for script in scripts:
        if not script.get("then"):
            continue
        at = _find(seq[:assistant], script["trigger_ids"])
        if at >= 0:
            done = sum(1 for token in seq[at:assistant] if token == Special.ASSISTANT.id)
            return script["then"][done - 1] if 1 <= done <= len(script["then"]) else default
    return default


def next_scripted_token(seq: Sequence[int], scripts: Sequence[dict]) -> int:
    """The token the scripted model emits after the token sequence `seq` (prompt + output)."""
    eos = Special.EOS.id
    assistant = _last(seq, Special.ASSISTANT.id)
    if assistant < 0 or assistant + 1 >= len(seq):
        return eos
    header = seq[assistant + 1]
    if header not in (Special.THINK_START.id, Special.THINK_END.id):
        return eos
    answer = _answer(seq, assistant, scripts)
    planned = [*answer["content_ids"], eos]
    written = list(seq[assistant + 2 :])
    if header == Special.THINK_START.id:
        reasoning = answer["reasoning_ids"]
        end = written.index(Special.THINK_END.id) if Special.THINK_END.id in written else -1
        if 0 <= end <= len(reasoning) and written[:end] == reasoning[:end]:
            written = written[end + 1 :]  # the reasoning ended (early if cut short): the answer
        else:
            planned = [*reasoning, Special.THINK_END.id, *planned]
    if len(written) >= len(planned) or planned[: len(written)] != written:
        return eos
    return planned[len(written)]


class DeepseekV41ScriptedForCausalLM(nn.Module):
    """SGLang model class of the scripted checkpoint (see the module docstring)."""

    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        from sglang.srt.layers.logits_processor import LogitsProcessor
        from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead

        super().__init__()
        scripts = getattr(config, SCRIPT_FIELD, None)
        if not scripts:
            raise Ds41Error(
                f"scripted model: config.json has no {SCRIPT_FIELD!r} (expected the scripts that "
                "sglang_ds41.checkpoint.scripted writes there)"
            )
        self.config = config
        self.scripts = list(scripts)
        self.hidden_size = config.hidden_size
        # Zero logits for every token from SGLang's own head and logits processor, so that
        # batching, logprobs and TP gathering behave as for a real model; forward() then
        # overwrites the last-token logits with the script.
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, prefix=f"{prefix}lm_head")
        self.logits_processor = LogitsProcessor(config)
        # token id held in each KV slot: the whole sequence of any request, prefix hits included
        self.slot_tokens = torch.zeros(0, dtype=torch.long)

    def _remember(self, input_ids: torch.Tensor, slots: torch.Tensor) -> None:
        need = int(slots.max()) + 1 if slots.numel() else 0
        if need > self.slot_tokens.numel():
            grown = torch.zeros(max(need, 2 * self.slot_tokens.numel()), dtype=torch.long)
            grown[: self.slot_tokens.numel()] = self.slot_tokens
            self.slot_tokens = grown
        self.slot_tokens[slots.long().cpu()] = input_ids.long().cpu()

    def _sequence(self, req_to_token: torch.Tensor, row: int, length: int) -> list[int]:
        return self.slot_tokens[req_to_token[row, :length].long().cpu()].tolist()

    @torch.no_grad()
    def forward(self, input_ids, positions, forward_batch, *args, **kwargs):
        from sglang.srt.model_executor.forward_context import get_req_to_token_pool

        self._remember(input_ids, forward_batch.out_cache_loc)
        hidden = torch.zeros(
            input_ids.shape[0], self.hidden_size, dtype=self.lm_head.weight.dtype, device=input_ids.device
        )
        out = self.logits_processor(input_ids, hidden, self.lm_head, forward_batch)
        logits = out.next_token_logits
        if logits is None:
            return out
        req_to_token = get_req_to_token_pool().req_to_token
        rows = forward_batch.req_pool_indices.tolist()
        lengths = forward_batch.seq_lens.tolist()
        for i, (row, length) in enumerate(zip(rows, lengths, strict=False)):
            if i >= logits.shape[0]:
                break
            token = next_scripted_token(self._sequence(req_to_token, row, length), self.scripts)
            logits[i].fill_(-1e4)
            logits[i, token] = 1e4
        return out

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        for _name, _tensor in weights:
            pass  # the placeholder tensor; the head stays zero
        with torch.no_grad():
            self.lm_head.weight.zero_()


EntryClass = [DeepseekV41ScriptedForCausalLM]

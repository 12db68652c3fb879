"""`DeepseekV41ForCausalLM` as an out-of-tree SGLang model (the official checkpoints' architecture).

Same skeleton as SGLang's model files (attention, MoE, Engram, decoder layer, model, causal-LM
wrapper, `load_weights`, `EntryClass`) and the same concept and parameter names as the
reference (`reference/model.py`): the math is `model/` and `engram/`, written once; this file
adds only SGLang's batching, KV slots and TP. Read it beside `reference.model.Block` /
`Transformer`: `DeepseekV41DecoderLayer.forward` is `Block.forward` for the whole batch, its
attention the reference layer's phases run once over all requests with the state in the slot
store (`attention.batch_attention`), its Engram the same `EngramLayer` with the TP sum.

State (docs/SGLANG_CPU.md §3.4, §6): everything per token is stored at SGLang's KV slot ids
(`kv_state.SlotState`: token ids, window KV, compressed latents, index keys; the ratio-2
pending token per request slot), read back through `req_to_token`, so chunked prefill, decode
and radix prefix hits resume exactly. Served, those rows are SGLang's own hybrid sliding-window
pool: `serve/launch_hooks.py` gives it one K row per token of exactly our packed bytes (no V
rows) and `slot_store` hands its buffers to the state (`kv_state.PoolViews`). A ratio-2 layer
needs an even `--page-size` (`serve` defaults to 2), checked at start-up.

Dtype: the model computes in `$SGLANG_DS41_DTYPE` when set (float64 / float32 / bfloat16;
the exactness tests use float64, like the reference oracle), else in SGLang's `--dtype`. The
checkpoint's `quantization_config` is ours to interpret (the shared loader dequantises), so
`serve/launch_hooks.py` keeps SGLang's quantization machinery out of it.

TP (MODEL.md §13, `tp.py`): embedding and head vocab-parallel, query heads / output groups and
every expert's intermediate width split over the ranks, `wo_b` and the MoE output all-reduced;
the rest replicated. Engram tables are row-sharded across ranks and their lookups all-reduced
(exact: every row has one owner, the others add zeros). Logits and logprobs go through SGLang's
`LogitsProcessor`, which all-gathers the vocab slices. Routed experts are split by TP only (no
expert parallelism yet). Not yet served: speculative decoding (DSpark).

Images (`images.py`): SGLang's V4.1 processor expands each placeholder into the image's span;
the scheduler pads the span with hash-derived ids (radix keys by image data); on prefill the
shared `VisionTower` (replicated on every rank) embeds each image and its rows replace the
token embeddings at image positions; the pad ids go back to `image_token_id` before anything
else sees them (slot-store history, Engram: DEAD, router: `bias_vl`). The image token is never
sampled (its logit is masked).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from torch import nn

from sglang_ds41.checkpoint.load import engram_hasher
from sglang_ds41.config import TextConfig, V41Config
from sglang_ds41.engram.hashing import EngramHasher
from sglang_ds41.engram.layer import EngramLayer
from sglang_ds41.errors import Ds41Error
from sglang_ds41.fast import engram as fast_engram
from sglang_ds41.fast import hashing, head, mhc, moe
from sglang_ds41.model import Attention, HyperConnection, MoE, Published, RMSNorm, first_pre
from sglang_ds41.model.batch import Chunks
from sglang_ds41.model.vision import VisionTower

from . import EXTERNAL_MODEL_PACKAGE, images
from .attention import batch_attention
from .kv_state import PoolViews, SlotState, Span
from .tp import SINGLE, TensorParallel, VocabParallelEmbedding

logger = logging.getLogger(__name__)

DTYPE_ENV = "SGLANG_DS41_DTYPE"
# SGLang's hybrid pool needs one "full" layer for its full slot space; `serve/launch_hooks.py` names
# layer 0, and its K rows hold each slot's full-side row (token id, compressed-entry pieces).
WINDOW_POOL_FULL_LAYER = 0
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
SMALL_FORWARD_TOKENS = 16  # forwards this small run on one thread (`one_thread_for_small`)


class BackendError(Ds41Error):
    """The SGLang backend cannot serve this checkpoint or this batch."""


def compute_dtype() -> torch.dtype:
    name = os.environ.get(DTYPE_ENV)
    if not name:
        return torch.get_default_dtype()
    if name not in DTYPES:
        raise BackendError(f"{DTYPE_ENV}={name!r}: expected one of {sorted(DTYPES)}")
    return DTYPES[name]


class DeepseekV41DecoderLayer(nn.Module):
    """One backbone layer (`layers.L.*`), as `reference.model.Block`."""

    def __init__(self, cfg: TextConfig, local: TextConfig, layer: int, tp: TensorParallel):
        """`local`: `cfg` with this rank's heads, output groups and expert width (`tp.py`)."""
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.layer, self.tp = layer, tp
        # this rank's table rows (attached by `weights.load_checkpoint`), summed over the ranks
        self.engram = None
        if layer in cfg.engram_layer_ids:
            self.engram = EngramLayer(cfg, layer, tp.sum_shards, apply_gate=fast_engram.apply_engram)
        self.hc_attn = HyperConnection(cfg)
        self.attn_norm = RMSNorm(d, eps)
        self.attn = Attention(local, layer)
        self.hc_ffn = HyperConnection(cfg)
        self.ffn_norm = RMSNorm(d, eps)
        self.ffn = MoE(local)

    def forward(
        self,
        r: torch.Tensor,
        pre: torch.Tensor,
        chunks: Chunks,
        published: Published,
        store: SlotState,
        is_image: torch.Tensor,
        engram_ids: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """R [T, hc, D], pre [T, hc] of the previous site -> (R, pre of this layer's MoE site)."""
        if self.engram is not None:
            r = self.engram(r, engram_ids, is_image)
        coeffs = mhc.coefficients(self.hc_attn, r)
        x = mhc.collapse_norm(r, pre, self.attn_norm)
        y = self.tp.all_reduce(batch_attention(self.attn, x, chunks, published, store))
        r = mhc.expand(r, y, coeffs.post, coeffs.comb)
        pre = coeffs.pre
        coeffs = mhc.coefficients(self.hc_ffn, r)
        y = self.tp.all_reduce(moe.forward(self.ffn, mhc.collapse_norm(r, pre, self.ffn_norm), is_image))
        return mhc.expand(r, y, coeffs.post, coeffs.comb), coeffs.pre


class DeepseekV41Model(nn.Module):
    """Embedding, layers, final norm (the reference `Transformer` without its head)."""

    def __init__(self, config: V41Config, hasher: EngramHasher, tp: TensorParallel):
        super().__init__()
        t = config.text
        self.text, self.hasher = t, hasher
        self.image_token_id = config.image_token_id
        d = t.hidden_size
        local = tp.local_text_config(t)  # names the field when a shape does not split
        self.embed = VocabParallelEmbedding(t.vocab_size, d, tp)
        self.image_start = nn.Parameter(torch.zeros(d))
        self.image_newline = nn.Parameter(torch.zeros(d))
        self.image_end = nn.Parameter(torch.zeros(d))
        self.layers = nn.ModuleList(
            DeepseekV41DecoderLayer(t, local, layer, tp) for layer in range(t.num_hidden_layers)
        )
        self.norm = RMSNorm(d, t.rms_norm_eps)

    def forward(
        self,
        input_ids: torch.Tensor,
        chunks: Chunks,
        spans: list[Span],
        store: SlotState,
        input_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """New tokens of all requests [T] (`chunks`' rows) -> final hidden states [T, D].
        `input_embeds` [T, D]: the input embeddings when images replaced some (else the table's)."""
        t = input_ids.shape[0]
        is_image = input_ids == self.image_token_id
        e = self.embed(input_ids) if input_embeds is None else input_embeds.to(self.embed.weight.dtype)
        r = e[:, None, :].expand(t, self.text.hc_mult, e.shape[-1]).contiguous()  # [T, hc, D]
        engram_ids = self.engram_rows(input_ids, spans, store)  # [T, n_engram_layers, n_columns]
        pre = first_pre(r)
        published = Published()
        for layer in self.layers:
            ids = None
            if layer.engram is not None:
                ids = engram_ids[:, self.hasher.layout.index_of(layer.layer)]
            r, pre = layer(r, pre, chunks, published, store, is_image, ids)
        return mhc.collapse_norm(r, pre, self.norm)

    def engram_rows(self, input_ids: torch.Tensor, spans: list[Span], store: SlotState) -> torch.Tensor:
        """Hash the batch's chunks, each continuing the history rebuilt from its slots' token ids."""
        before, counts = store.history_ids(spans, self.hasher.history_len)
        lengths = torch.tensor([s.length for s in spans], dtype=torch.int64)
        return hashing.rows(self.hasher, before, counts, input_ids, lengths)


@contextlib.contextmanager
def one_thread_for_small(tokens: int) -> Iterator[None]:
    """A forward of at most SMALL_FORWARD_TOKENS tokens (decode steps) runs on one torch thread:
    its ops take microseconds, so OpenMP's fork and join cost more than they save, and a
    thread that waits on a core held by another process (SGLang's tokenizer, detokenizer,
    another rank) stalls every op (a tiny-model step took 40x longer on two loaded cores)."""
    threads = torch.get_num_threads()
    if tokens > SMALL_FORWARD_TOKENS or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def refuse_gpu_device(device: str) -> None:
    """This backend is the exact CPU engine (torch-native, no GPU kernels): serving the real
    model on a GPU is upstream SGLang's V4.1 model with our plugin, so say that instead of
    starting a server that would not fit or would crawl."""
    if device != "cpu":
        raise BackendError(
            f"sglang-ds41's own backend (SGLANG_EXTERNAL_MODEL_PACKAGE={EXTERNAL_MODEL_PACKAGE}) is the "
            f"CPU engine and does not serve on --device {device}: it has no GPU kernels and builds every "
            "expert dense. On a GPU serve upstream SGLang's V4.1 model, which the sglang-ds41 plugin gives "
            "the MXFP4 Engram tables: `sglang-ds41 serve MODEL_DIR` (it picks that engine on a GPU) or "
            "`python -m sglang.launch_server --model-path MODEL_DIR` without SGLANG_EXTERNAL_MODEL_PACKAGE"
        )


class DeepseekV41ForCausalLM(nn.Module):
    """The SGLang entry: builds the model from the checkpoint's own config.json (SGLang's
    flattened V3-style config is not used), keeps the slot store, returns next-token logits."""

    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        super().__init__()
        from sglang.srt.distributed.parallel_state import (
            get_tensor_model_parallel_rank,
            get_tensor_model_parallel_world_size,
        )
        from sglang.srt.runtime_context import get_context, get_server_args

        args = get_server_args()  # outside a server this names the missing server args
        refuse_gpu_device(str(get_context().config_leaf("device")))  # resolved, not the raw flag
        self.config = config
        self.logits_processor = None
        self._build(
            Path(args.model_path),
            compute_dtype(),
            args.page_size,
            TensorParallel(
                get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size(), "sglang"
            ),
        )
        from sglang.srt.layers.logits_processor import LogitsProcessor

        # SGLang's logits processor picks the rows to sample, all-gathers the vocab slices of the
        # head and computes logprobs; its math is fp32 (float64 stays float64).
        self.logits_processor = LogitsProcessor(config)
        self.logits_processor.use_fp32_lm_head = self.dtype != torch.float64

    @classmethod
    def for_checkpoint(
        cls, model_dir: str | Path, dtype: torch.dtype, page_size: int = 2, tp: TensorParallel = SINGLE
    ) -> DeepseekV41ForCausalLM:
        """The model outside an SGLang server (tests, benchmarks), weights loaded. With
        `tp.size > 1` the ranks talk through `torch.distributed`'s default group."""
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.config, self.logits_processor = None, None
        self._build(Path(model_dir), dtype, page_size, tp)
        self.load_weights(())
        return self

    def _build(self, model_dir: Path, dtype: torch.dtype, page_size: int, tp: TensorParallel) -> None:
        self.model_dir, self.dtype, self.tp = model_dir, dtype, tp
        self.v41 = V41Config.from_file(model_dir / "config.json")
        text = self.v41.text
        if any(r == 2 for r in text.compress_ratios) and page_size % 2:
            raise BackendError(
                f"DeepseekV41ForCausalLM: --page-size {page_size} is odd, but ratio-2 layers keep "
                "one compressed entry per token pair at slot // 2, which needs an even page size "
                "(serve with --page-size 2 or any even size)"
            )
        self.model = DeepseekV41Model(self.v41, engram_hasher(self.v41, model_dir), tp)
        start, stop = tp.vocab_rows(text.vocab_size)
        self.head = nn.Linear(text.hidden_size, stop - start, bias=False)  # this rank's vocab rows
        self.sglang_head = head.SglangHead(self.head)  # skips the head's all-zero rows
        self.store: SlotState | None = None
        self.vision_tower: VisionTower | None = None  # built by load_weights (it has its own loader)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Ignores SGLang's iterator (nothing is read from it) and loads through the shared
        reader, which knows the official layout and its formats."""
        from .weights import load_checkpoint

        engram = [layer.engram for layer in self.model.layers if layer.engram is not None]
        load_checkpoint(self, self.model_dir, self.dtype, engram, self.tp)
        if self.v41.vision is not None:
            from sglang_ds41.vision.weights import load_vision_tower

            # Registered after the language model's tensors are filled: its names are its own.
            self.vision_tower = load_vision_tower(self.model_dir, self.dtype).to(self.head.weight.device)
        self.requires_grad_(False).eval()
        for module in engram:
            shard = module.table.shard
            logger.info(
                "DeepseekV41 Engram layer %d: TP rank %d/%d holds rows %d:%d of %d (%s)",
                module.layer,
                self.tp.rank,
                self.tp.size,
                shard.start,
                shard.stop,
                module.table.num_rows,
                module.table.fmt.format.name,
            )

    def slot_store(self) -> SlotState:
        from sglang.srt.model_executor.forward_context import get_req_to_token_pool, get_token_to_kv_pool

        pool = get_token_to_kv_pool()
        req_rows = get_req_to_token_pool().req_to_token.shape[0]
        full = pool.get_key_buffer(WINDOW_POOL_FULL_LAYER)
        rows = full.shape[0]
        # Under SGLang's hybrid sliding-window pool (the default, see `serve/launch_hooks.py`) the window
        # KV lives in the SWA slots it keeps for the last window of each request and cached
        # prefix, and both pools were given our row geometry: the state lives in their K buffers.
        translate = getattr(pool, "translate_loc_from_full_to_swa", None)
        views = None
        window_rows = rows
        if translate is not None:
            layers = range(WINDOW_POOL_FULL_LAYER + 1, self.v41.text.num_hidden_layers)
            views = PoolViews.of_k_buffers(full, {layer: pool.get_key_buffer(layer) for layer in layers})
            window_rows = views.window[WINDOW_POOL_FULL_LAYER + 1].shape[0]
        if self.store is None or not self.store.fits(rows, req_rows, window_rows):
            self.store = SlotState(
                self.v41.text,
                rows,
                req_rows,
                self.dtype,
                self.head.weight.device,
                window_rows=window_rows,
                window_slots=translate,
                pool=views,
            )
        return self.store

    def get_attention_sliding_window_size(self) -> int:
        """SGLang's window `w` keeps positions >= q - w: V4.1's 128 tokens (itself included) are 127."""
        return self.v41.text.sliding_window - 1

    def spans(self, forward_batch, n_tokens: int) -> list[Span]:
        from sglang.srt.model_executor.forward_context import get_req_to_token_pool

        req_to_token = get_req_to_token_pool().req_to_token
        rows = forward_batch.req_pool_indices.tolist()
        seq_lens = forward_batch.seq_lens.tolist()
        if forward_batch.forward_mode.is_extend():
            lengths = list(forward_batch.extend_seq_lens_cpu or forward_batch.extend_seq_lens.tolist())
        else:
            lengths = [1] * len(rows)
        if sum(lengths) != n_tokens:
            raise BackendError(
                f"forward batch: new-token counts {lengths} do not add up to the {n_tokens} input ids"
            )
        spans, offset = [], 0
        for row, seq_len, length in zip(rows, seq_lens, lengths, strict=True):
            slots = req_to_token[row, :seq_len].to(torch.int64)
            spans.append(Span(row, seq_len - length, length, offset, slots))
            offset += length
        return spans

    def pad_input_ids(self, input_ids, mm_inputs):
        """SGLang's scheduler hook: image spans keyed by their image data in the radix cache."""
        return images.pad_ids(input_ids, mm_inputs)

    @torch.no_grad()
    def get_image_feature(self, items) -> list[torch.Tensor]:
        """SGLang's embedding hook: one complete span of embeddings per image item."""
        if self.vision_tower is None:
            raise BackendError(f"{self.model_dir}: a request has images but no vision tower was loaded")
        return images.image_spans(self.vision_tower, items, self.head.weight.device)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch, *args, **kwargs):
        with one_thread_for_small(input_ids.numel()):
            return self._forward(input_ids, positions, forward_batch)

    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch):
        if input_ids.numel() == 0:
            from sglang.srt.layers.logits_processor import LogitsProcessorOutput

            return LogitsProcessorOutput(next_token_logits=torch.zeros(0, self.v41.text.vocab_size))
        store = self.slot_store()
        spans = self.spans(forward_batch, input_ids.numel())
        embeds = None
        if images.has_images(forward_batch):
            embeds = images.prompt_embeddings(self, input_ids, forward_batch, self.model.embed)
        input_ids = images.vocab_ids(input_ids, self.model.image_token_id)
        h = self.hidden_states(input_ids, positions, forward_batch.out_cache_loc, spans, store, embeds)
        out = self.logits_processor(input_ids, h, self.sglang_head, forward_batch)
        if out.next_token_logits is not None:
            out.next_token_logits[:, self.model.image_token_id] = float("-inf")  # needs image embeddings
        return out

    @torch.no_grad()
    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        out_cache_loc: torch.Tensor,
        spans: list[Span],
        store: SlotState,
        input_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The batch's new tokens [T] (span order), written at slots `out_cache_loc` [T] ->
        final hidden states [T, D] (before the head); `input_embeds` [T, D] with images."""
        expected = torch.cat([torch.arange(s.start, s.end) for s in spans])
        got = positions.cpu().to(torch.int64)
        if not torch.equal(got, expected):
            if got.shape != expected.shape:
                found = f"expected {expected.numel()} positions, got {got.numel()}"
            else:
                i = int(torch.nonzero(got != expected)[0])
                found = f"token {i}: expected position {int(expected[i])}, got {int(got[i])}"
            raise BackendError(
                f"forward batch: positions are not each request's next contiguous positions ({found}; "
                f"spans {[(s.start, s.end) for s in spans]})"
            )
        store.write_tokens(out_cache_loc.to(torch.int64), input_ids)
        chunks = store.begin_forward(spans)
        try:
            return self.model(input_ids, chunks, spans, store, input_embeds)
        finally:
            store.end_forward()

    @torch.no_grad()
    def next_token_logits(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        out_cache_loc: torch.Tensor,
        spans: list[Span],
        store: SlotState,
        input_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Outside a server: logits [B, vocab] of each request's last new token (fp32 math,
        float64 in float64), the image token masked as the server masks it."""
        h = self.hidden_states(input_ids, positions, out_cache_loc, spans, store, input_embeds)
        last = torch.tensor([s.offset + s.length - 1 for s in spans])
        logits = self.tp.all_gather_last(head.logits(self.head, h[last]))  # [B, vocab]
        logits[:, self.model.image_token_id] = float("-inf")
        return logits


EntryClass = [DeepseekV41ForCausalLM]

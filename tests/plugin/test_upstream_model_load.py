"""Upstream SGLang's whole V4.1 model, built and loaded from a tiny checkpoint with our plugin.

Two TP ranks (one process each, gloo) do what a scheduler process does before it serves:
`load_plugins()`, `publish(server_args, role="scheduler", ranks=...)`, SGLang's `ModelConfig`,
the loader's quantization config (`Fp8Config`, block 32x32, FP4 routed experts), the process
groups, `_initialize_model` under the loader's default dtype and target device (the real CPU),
then `DefaultModelLoader.load_weights_only` over the loader's own safetensors iterator, which
calls upstream's `DeepseekV4ForCausalLM.load_weights`. Every weight is really copied.

What is not a GPU server's path, and why (each forced by this CPU-only machine or the tiny size):

* `SGLANG_USE_CPU_ENGINE=1` with our `sgl_kernel` CPU shim: without `is_cpu()` upstream's
  rotary embedding imports `vllm._custom_ops` on a non-CUDA machine
  (`layers/rotary_embedding/base.py:138`); the CPU engine imports `sgl_kernel`'s CPU ops.
  CPU-engine weight loaders narrow with padding (a no-op at these shapes).
* `server_args.device = "cuda"`: `MQALayer` asks `get_rope_wrapper(device=get_device().device)`
  for its rope, and the CPU branch only knows `deepseek_yarn`, so the uncompressed layers'
  plain rope asserts (`layers/rotary_embedding/factory.py:478`). Tensors still go to the CPU.
* `SGLANG_OPT_USE_TILELANG_MHC_PRE=0` (what upstream sets on SM120 and ROCm): `load_weights`
  ends with a tilelang mHC prewarm that needs a CUDA device.
* `SGLANG_NCCL_SO_PATH` pointing nowhere: no PyNccl on CPU process groups.
* `--ep-size 2` and `SGLANG_SHARED_EXPERT_TP1=1`: the tiny experts are 32 wide, one FP8 block;
  TP=2 would split them into 16-wide shards, which upstream's block check refuses.
* Not run: `process_weights_after_loading` (asserts AMX kernels on CPU), the draft model
  (`mtp.*` tensors; upstream's main model skips them), host-memory Engram tables.

Recording only: every parameter's `weight_loader` is wrapped to note which checkpoint tensor
reached it and to keep the few tensors upstream builds itself (fused wq_a+wkv, dequantized wo_a);
each wrapper calls the original loader unchanged.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

TP = 2
ENGRAM_LAYERS = (1, 2)
# The random tiny checkpoint with each table format, and the trained tiny model (hidden 128, ~96k
# Engram rows; `checkpoint.trained`) with MXFP4 tables: checkpoint name -> its Engram format.
FORMATS = {"mxfp4": "mxfp4", "fp8": "fp8", "trained-mxfp4": "mxfp4"}
# tensors upstream turns into new ones before a weight_loader sees them (checked separately)
FUSED = {"wqkv_a": ("wq_a", "wkv"), "wo_a": ("wo_a",)}
FUSED_TARGET = re.compile(rf"\.self_attn\.({'|'.join(FUSED)})\.[a-z_]+$")
WORKER_ENV = {
    "SGLANG_USE_CPU_ENGINE": "1",
    "SGLANG_OPT_USE_TILELANG_MHC_PRE": "0",
    "SGLANG_NCCL_SO_PATH": "/nonexistent/libnccl.so.2",
    "SGLANG_SHARED_EXPERT_TP1": "1",
    "OMP_NUM_THREADS": "1",
}
WORKER_TIMEOUT_S = 300

pytestmark = pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="needs sglang")


# ---- the worker: one TP rank of a server, up to the end of load_weights -------------------------


def _worker(ckpts: list[str], tp_rank: int, init_method: str, out: Path) -> None:
    from sglang_ds41.serve.cpu import install

    install()  # the CPU engine imports sgl_kernel's CPU ops
    from sglang.srt.plugins import load_plugins

    load_plugins()
    import torch
    from sglang.srt.layers import engram as upstream_engram

    print(f"rank {tp_rank}: SGLang imported at {time.process_time():.1f} s CPU", flush=True)
    torch.set_num_threads(1)
    cls = upstream_engram.EngramEmbedding
    report = {
        "embedding_class": f"{cls.__module__}.{cls.__qualname__}",
        "checkpoints": {
            Path(ckpt).name: _load(ckpt, tp_rank, init_method, out, first=not i)
            for i, ckpt in enumerate(ckpts)
        },
    }
    (out / f"rank{tp_rank}.json").write_text(json.dumps(report))
    print(f"rank {tp_rank}: done at {time.process_time():.1f} s CPU", flush=True)


def _load(ckpt: str, tp_rank: int, init_method: str, out: Path, first: bool) -> dict:
    """Publish this rank's server config for `ckpt`, build upstream's model, run load_weights."""
    import logging

    import torch
    from safetensors.torch import save_file
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
    from sglang.srt.layers.dp_attention import init_dp_gathered_buffer, initialize_dp_attention
    from sglang.srt.layers.moe import initialize_moe_config
    from sglang.srt.model_loader.loader import (
        DefaultModelLoader,
        _get_quantization_config,
        _initialize_model,
        get_model_loader,
    )
    from sglang.srt.model_loader.utils import set_default_torch_dtype
    from sglang.srt.model_loader.weight_utils import default_weight_loader
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    ready = Path(ckpt).with_suffix(".ready")
    while not ready.exists():  # the test writes the checkpoint meanwhile
        time.sleep(0.05)
    server_args = ServerArgs(model_path=ckpt, device="cuda", tp_size=TP, ep_size=TP)
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=tp_rank, gpu_id=tp_rank))
    initialize_moe_config()
    model_config = ModelConfig.from_server_args(server_args)
    load_config = LoadConfig(load_format=server_args.load_format)
    loader = get_model_loader(load_config, model_config)
    quant_config = _get_quantization_config(model_config, load_config)
    if first:  # one set of process groups per process, as in a scheduler
        init_distributed_environment(
            world_size=TP,
            rank=tp_rank,
            local_rank=tp_rank,
            distributed_init_method=init_method,
            backend="gloo",
            timeout=WORKER_TIMEOUT_S,
        )
        initialize_model_parallel()
    initialize_dp_attention(server_args=server_args)
    init_dp_gathered_buffer(model_config)
    built = time.perf_counter()
    with set_default_torch_dtype(model_config.dtype), torch.device("cpu"):
        model = _initialize_model(model_config, load_config, quant_config)
    built = time.perf_counter() - built

    params = dict(model.named_parameters())  # what upstream's load_weights looks names up in
    tensor_names: dict[int, str] = {}
    yielded: list[torch.Tensor] = []  # also keeps every id unique
    calls: list[tuple[str, str | None]] = []
    fused_inputs: dict[str, torch.Tensor] = {}

    def recording(name, original):
        def weight_loader(param, loaded, *args, **kwargs):
            calls.append((name, tensor_names.get(id(loaded))))
            if FUSED_TARGET.search(name):
                fused_inputs[name] = loaded.detach().clone()
            return original(param, loaded, *args, **kwargs)

        return weight_loader

    for name, param in params.items():
        wrapped = recording(name, getattr(param, "weight_loader", default_weight_loader))
        try:
            param.weight_loader = wrapped
        except AttributeError:  # BasevLLMParameter: a read-only property over _weight_loader
            param._weight_loader = wrapped

    def checkpoint(weights):
        for name, tensor in weights:
            tensor_names[id(tensor)] = name
            yielded.append(tensor)
            yield name, tensor

    records: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record):
            records.append(f"{record.levelname} {record.name}: {record.getMessage()}")

    capture = Capture(logging.WARNING)
    logging.getLogger().addHandler(capture)
    try:
        start = time.perf_counter()
        weights = checkpoint(loader._get_all_weights(model_config, model))
        DefaultModelLoader.load_weights_only(model, weights, torch.device("cpu"))
        seconds = time.perf_counter() - start
    finally:
        logging.getLogger().removeHandler(capture)

    tables = {}
    saved = {f"fused/{name}": t for name, t in fused_inputs.items()}
    for layer in ENGRAM_LAYERS:
        embed = model.model.layers[layer].engram.embed
        tables[layer] = {
            "class": f"{type(embed).__module__}.{type(embed).__qualname__}",
            "format": getattr(getattr(embed, "table_format", None), "name", ""),
            "weight": [str(embed.weight.dtype), list(embed.weight.shape)],
            "scale": [str(embed.scale.dtype), list(embed.scale.shape)],
            "row_start": embed.row_start,
            "rows": embed.rows,
        }
        saved[f"engram/{layer}/weight"] = embed.weight.detach()
        saved[f"engram/{layer}/scale"] = embed.scale.detach()
    # 1-byte formats as their bytes (safetensors' float8 support varies)
    saved = {k: (v.view(torch.uint8) if v.element_size() == 1 else v).contiguous() for k, v in saved.items()}
    save_file(saved, str(out / f"rank{tp_rank}-{Path(ckpt).name}.safetensors"))
    return {
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
        "quant_config": type(quant_config).__name__,
        "fp4_experts": bool(getattr(quant_config, "is_fp4_experts", False)),
        "params": sorted(params),
        "yielded": [tensor_names[id(t)] for t in yielded],
        "calls": calls,
        "log": records,
        "tables": tables,
        "seconds": {"build": built, "load_weights": seconds},
    }


# ---- the test side ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """Both ranks build upstream's model and load the MXFP4, then the FP8 tiny checkpoint, then
    the trained tiny model with MXFP4 tables.

    The ranks start first; each checkpoint is written while they import SGLang (or load the
    previous one) and released to them by its `.ready` file.
    """
    from sglang_ds41.checkpoint import trained
    from sglang_ds41.checkpoint.tiny import write_tiny

    root = tmp_path_factory.mktemp("upstream-load")
    ckpts = {fmt: root / f"tiny-{fmt}" for fmt in FORMATS}
    out = root / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_PLUGINS"} | WORKER_ENV
    args = [",".join(str(ckpts[f]) for f in FORMATS), f"file://{root / 'pg'}", str(out)]
    logs = [root / f"rank{rank}.log" for rank in range(TP)]
    procs = []
    try:
        for rank, log in enumerate(logs):
            with log.open("w") as sink:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, __file__, args[0], str(rank), *args[1:]],
                        env=env,
                        cwd=root,
                        stdout=sink,
                        stderr=subprocess.STDOUT,
                    )
                )
        for name, ckpt in ckpts.items():
            if name.startswith("trained"):
                trained.expand(ckpt, engram=FORMATS[name])
            else:
                write_tiny(ckpt, "base", FORMATS[name], seed=0)
            ckpt.with_suffix(".ready").touch()
        deadline = time.monotonic() + WORKER_TIMEOUT_S
        for proc in procs:
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
    finally:
        for proc in procs:  # a rank that failed leaves its peer waiting in a collective
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for rank, proc in enumerate(procs):
        tail = logs[rank].read_text(errors="replace")[-6000:]
        assert proc.returncode == 0, f"rank {rank} failed or timed out (rc {proc.returncode}):\n{tail}"
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(TP)]
    return {"ckpts": ckpts, "out": out, "reports": reports}


def _checkpoint_tensor(ckpt: Path, name: str):
    from safetensors import safe_open

    weight_map = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    with safe_open(str(ckpt / weight_map[name]), framework="pt") as f:
        return f.get_tensor(name)


def _saved(loaded, rank: int, fmt: str) -> dict:
    from safetensors.torch import load_file

    return load_file(str(loaded["out"] / f"rank{rank}-{loaded['ckpts'][fmt].name}.safetensors"))


def _layer_count(ckpt: Path) -> int:
    return json.loads((ckpt / "config.json").read_text())["text_config"]["num_hidden_layers"]


def test_plugin_replaces_upstream_engram_embedding(loaded):
    for report in loaded["reports"]:
        assert report["embedding_class"] == "sglang_ds41.plugin.tables.embedding.Ds41EngramEmbedding"
        for fmt in FORMATS:
            built = report["checkpoints"][loaded["ckpts"][fmt].name]
            assert built["model_class"] == "sglang.srt.models.deepseek_v4.DeepseekV4ForCausalLM"
            assert (built["quant_config"], built["fp4_experts"]) == ("Fp8Config", True)


@pytest.mark.parametrize("fmt", FORMATS)
def test_upstream_expects_no_weight_the_checkpoint_lacks(loaded, fmt):
    """Upstream's own check ("Some weights are not initialized from checkpoints") stays silent,
    and so does every other warning of the load; every parameter got a loader call except the
    KV-cache scales upstream's check exempts (this checkpoint has none)."""
    for rank, report in enumerate(loaded["reports"]):
        built = report["checkpoints"][loaded["ckpts"][fmt].name]
        assert built["log"] == [], f"rank {rank}: {built['log']}"
        called = {param for param, _ in built["calls"]}
        uncalled = set(built["params"]) - called
        assert uncalled, "the model should still have its KV-cache scale parameters"
        assert all(re.search(r"\.attn_mqa\.[kv]_scale$", p) for p in uncalled), sorted(uncalled)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_checkpoint_tensor_reaches_a_weight_loader(loaded, fmt):
    """The loader yields every tensor in the files; each one reaches a weight_loader as is,
    except the draft model's (`mtp.*`, which upstream's main model skips) and the ones upstream
    fuses or dequantizes first (tested in `test_fused_tensors_reach_their_loader`)."""
    ckpt = loaded["ckpts"][fmt]
    stored = set(json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"])
    fused = {
        f"layers.{i}.attn.{part}.{kind}"
        for i in range(_layer_count(ckpt))
        for sources in FUSED.values()
        for part in sources
        for kind in ("weight", "scale")
    }
    assert fused <= stored
    draft = {name for name in stored if name.startswith("mtp.")}
    assert draft
    for rank, report in enumerate(loaded["reports"]):
        built = report["checkpoints"][ckpt.name]
        assert sorted(built["yielded"]) == sorted(stored), f"rank {rank}: the loader's iterator"
        reached = {source for _, source in built["calls"] if source is not None}
        assert stored - reached == draft | fused, f"rank {rank}"


@pytest.mark.parametrize("fmt", FORMATS)
def test_fused_tensors_reach_their_loader(loaded, fmt):
    """wq_a + wkv arrive concatenated (FP8 bytes and E8M0 scales), wo_a dequantized to bf16."""
    import torch

    from sglang_ds41.formats.fp8 import dequantize_fp8_block2d

    ckpt = loaded["ckpts"][fmt]

    def stored(name):
        return _checkpoint_tensor(ckpt, name)

    for rank in range(TP):
        saved = _saved(loaded, rank, fmt)
        for i in range(_layer_count(ckpt)):
            ours = f"fused/model.layers.{i}.self_attn"
            for param, kind in (("weight", "weight"), ("weight_scale_inv", "scale")):
                expected = torch.cat([stored(f"layers.{i}.attn.{p}.{kind}") for p in FUSED["wqkv_a"]])
                got = saved[f"{ours}.wqkv_a.{param}"]
                assert torch.equal(got, expected.view(torch.uint8)), f"rank {rank} layer {i} wqkv_a.{param}"
            wo_a = dequantize_fp8_block2d(
                stored(f"layers.{i}.attn.wo_a.weight"), stored(f"layers.{i}.attn.wo_a.scale")
            )
            assert torch.equal(saved[f"{ours}.wo_a.weight"], wo_a), f"rank {rank} layer {i} wo_a"


@pytest.mark.parametrize("fmt", FORMATS)
def test_engram_tables_hold_the_ranks_checkpoint_rows(loaded, fmt):
    """Each rank's table is our class, in the checkpoint's format, and holds exactly its row shard
    (MODEL.md's split, computed here by `engram.plan.shard_ranges`) byte for byte."""
    import torch

    from sglang_ds41.config import V41Config
    from sglang_ds41.engram.layout import EngramLayout
    from sglang_ds41.engram.plan import shard_ranges

    ckpt = loaded["ckpts"][fmt]
    text = V41Config.from_file(ckpt / "config.json").text
    layout = EngramLayout.from_config(text)
    dim = text.engram_head_dim
    weight = {"mxfp4": ("torch.uint8", dim // 2), "fp8": ("torch.float8_e4m3fn", dim)}[FORMATS[fmt]]
    for layer in ENGRAM_LAYERS:
        ranges = shard_ranges(layout.layers[layout.index_of(layer)], TP)
        table = {
            part: _checkpoint_tensor(ckpt, f"layers.{layer}.engram.embed.{part}")
            for part in ("weight", "scale")
        }
        for rank, report in enumerate(loaded["reports"]):
            got = report["checkpoints"][ckpt.name]["tables"][str(layer)]
            start, stop = ranges[rank]
            assert got["class"] == "sglang_ds41.plugin.tables.embedding.Ds41EngramEmbedding"
            assert got["format"] == FORMATS[fmt]
            assert (got["row_start"], got["rows"]) == (start, stop - start), f"rank {rank} layer {layer}"
            assert got["weight"] == [weight[0], [stop - start, weight[1]]]
            assert got["scale"] == ["torch.float8_e8m0fnu", [stop - start, dim // 32]]
            saved = _saved(loaded, rank, fmt)
            for part, full in table.items():
                rows = full.view(torch.uint8)[start:stop]
                assert torch.equal(saved[f"engram/{layer}/{part}"], rows), f"rank {rank} layer {layer} {part}"


if __name__ == "__main__":
    _worker(sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))

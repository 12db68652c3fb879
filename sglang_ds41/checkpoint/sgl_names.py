"""Official checkpoint names -> SGLang parameter names (MODEL.md §8.6.5).

SGLang's DeepSeek loader expects HF-Llama-style names (`model.layers.L.self_attn...`,
`weight_scale_inv`, `gate_proj`); the release uses the reference names. The backend's
`load_weights` maps every manifest entry through `sgl_name`, so the table lives in one place.

Where §8.6.5 is silent we chose (tagged [I] there too): the `.scale` of every block-quantised
linear (FP8 and MXFP4, i.e. attention, indexer, `engram.wkv`, shared and routed experts,
`mtp.0.main_proj`) becomes `.weight_scale_inv`; the Engram tables' row scales, NVFP4's
ModelOpt tensors and the vision MLP keep their names.
"""

from __future__ import annotations

import re

from sglang_ds41.checkpoint.manifest import TensorSpec

_LAYER = re.compile(r"^(layers|mtp)\.(\d+)\.")
_PROJ = {"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}
_EXPERT_PROJ = re.compile(r"\.(shared_experts|experts\.\d+)\.(w[123])\.")


def sgl_name(spec: TensorSpec, num_hidden_layers: int) -> str:
    """The SGLang parameter name of one checkpoint tensor (DSpark stage s -> layer 40 + s)."""
    name = spec.name
    if name.startswith("embed."):
        return "model.embed_tokens." + name.removeprefix("embed.")
    if name.startswith("head."):
        return "lm_head." + name.removeprefix("head.")
    if name == "norm.weight":
        return "model.norm.weight"
    if name.startswith("vision."):
        return name.replace(".attn.wqkv.", ".attn.qkv_proj.").replace(".attn.wo.", ".attn.proj.")
    match = _LAYER.match(name)
    if match is None:  # aligner.*, image_*
        return name
    layer = int(match[2]) + (num_hidden_layers if match[1] == "mtp" else 0)
    rest = "." + name[match.end() :]
    rest = rest.replace(".attn_norm.", ".input_layernorm.").replace(
        ".ffn_norm.", ".post_attention_layernorm."
    )
    rest = rest.replace(".attn.", ".self_attn.").replace(".ffn.", ".mlp.")
    rest = re.sub(r"\.gate\.bias(_vl)?$", r".gate.e_score_correction_bias\1", rest)
    rest = _EXPERT_PROJ.sub(lambda m: f".{m[1]}.{_PROJ[m[2]]}.", rest)
    if spec.role == "scale" and spec.format in ("fp8", "mxfp4"):
        rest = rest.removesuffix(".scale") + ".weight_scale_inv"
    return f"model.layers.{layer}{rest}"

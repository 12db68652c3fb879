"""The part of upstream SGLang the plugin is written against, checked before anything is hooked.

The plugin subclasses `sglang.srt.layers.engram.EngramEmbedding` and re-implements a few of
its methods for 4-bit tables; it calls upstream's private helpers (`_HostTable`,
`_sorted_host_reads`, `_cuda_kernels`); and it wraps parts of the OpenAI serving layer (the
deepseek-recipe chat adapter's parsing and streaming, the chat response builder, request
conversion: `parsers.py`, `thinking.py`; the Responses API's output: `responses.py`), the
xgrammar backend's structural-tag compile (`grammar_compile.py`) and the scheduler's grammar
set-up, whose reasoning grammar object counts and ends the reasoning (`thinking_budget.py`), and
the deepseek-recipe renderer's encode (`prompt_encoding.py`).
A different SGLang could rename them, change what they take, or change what the overridden or
wrapped methods do (a new storage mode our override would not know, another place the
thinking mode is read). So at import the plugin checks three things against SGLang 0.5.23
and refuses to hook anything if one differs, naming each difference:

* the installed version;
* the signature of every symbol it overrides or calls;
* a digest of the source of each method it overrides or whose body it re-implements
  (catches a patched install that kept the version string).
"""

from __future__ import annotations

import hashlib
import inspect
import pkgutil
from collections.abc import Mapping

from sglang_ds41.errors import Ds41Error
from sglang_ds41.install import SGLANG_VERSION

ENGRAM = "sglang.srt.layers.engram"
EMBEDDING = f"{ENGRAM}.EngramEmbedding"
XGRAMMAR_BACKEND = "sglang.srt.constrained.xgrammar_backend.XGrammarGrammarBackend"
RECIPE_ADAPTER = "sglang.srt.entrypoints.openai.serving_deepseek_recipe.DeepSeekRecipeChatEncodingAdapter"
RESPONSES = "sglang.srt.entrypoints.openai.serving_responses"
GRAMMAR_MANAGER = "sglang.srt.constrained.grammar_manager.GrammarManager"
REASONER = "sglang.srt.constrained.reasoner_grammar_backend"
RENDERER = "sglang.srt.parser.deepseek_recipe_renderer"

# symbol -> str(inspect.signature(symbol)) in SGLang 0.5.23
SIGNATURES: Mapping[str, str] = {
    f"{EMBEDDING}.__init__": "(self, num_embeddings: 'int', dim: 'int', layer_id: 'int', "
    "column_bounds: 'tuple[int, ...]')",
    f"{EMBEDDING}._init_host_table": "(self, num_embeddings: 'int', dim: 'int', layer_id: 'int')",
    f"{EMBEDDING}._load_rows": "(self, param: 'nn.Parameter', loaded_weight: 'torch.Tensor')",
    f"{EMBEDDING}.finish_load": "(self, label: 'str')",
    f"{EMBEDDING}.forward": "(self, indices: 'torch.Tensor', forward_batch: 'Optional[ForwardBatch]' = None, "
    "*, cp_all_tokens: 'bool' = False) -> 'torch.Tensor'",
    f"{EMBEDDING}.dequant_staged": "(self, rows: 'torch.Tensor', scales: 'torch.Tensor', "
    "copied: 'torch.cuda.Event', hash_shape: 'torch.Size') -> 'torch.Tensor'",
    f"{EMBEDDING}._owned_rows": "(self, indices: 'torch.Tensor') -> 'torch.Tensor'",
    f"{EMBEDDING}._table_ptrs": "(self) -> 'tuple[int, int]'",
    f"{EMBEDDING}.new_rows": "(self, indices: 'torch.Tensor') -> 'torch.Tensor'",
    f"{ENGRAM}.Engram.__init__": "(self, config, layer_id: 'int', layout: 'EngramLayout', "
    "quant_config: 'Optional[QuantizationConfig]' = None, prefix: 'str' = '', *, "
    "image_token_id: 'Optional[int]' = None)",
    f"{ENGRAM}.shard_range": "(num_embeddings: 'int', column_bounds: 'tuple[int, ...]', tp_rank: 'int', "
    "tp_size: 'int') -> 'tuple[int, int]'",
    f"{ENGRAM}._HostTable.__init__": "(self, layout: 'str', nbytes: 'int', name: 'str', group)",
    f"{ENGRAM}._sorted_host_reads": "(device: 'int') -> 'bool'",
    f"{ENGRAM}._cuda_kernels": "(t: 'torch.Tensor') -> 'bool'",
    # The V4.1 chat output (plugin/serving/parsers.py) and thinking decision (plugin/serving/thinking.py).
    "sglang.srt.entrypoints.openai.serving_deepseek_recipe.DeepSeekRecipeChatEncodingAdapter"
    ".__init__": "(self, *, "
    "chat_encoding_spec: 'str', tokenizer: 'Any', reasoning_parser: 'Optional[str]', tool_call_parser: "
    "'Optional[str]', chat_hooks: 'ChatOutputHooks', default_chat_template_kwargs: 'Optional[dict[str, "
    "Any]]')",
    "sglang.srt.entrypoints.openai.serving_deepseek_recipe.DeepSeekRecipeChatEncodingAdapter"
    ".parse_chat_response": "("
    "self, *, request: 'ChatCompletionRequest', output_ids: 'list[int]', finish_reason: 'dict[str, Any]') -> "
    "'tuple[Optional[str], str, Optional[list[ToolCall]], dict[str, Any]]'",
    "sglang.srt.entrypoints.openai.serving_deepseek_recipe.DeepSeekRecipeChatEncodingAdapter"
    ".stream_chat_chunks": "("
    "self, *, content: 'dict[str, Any]', index: 'int', request: 'ChatCompletionRequest', created: 'int', "
    "parser_dict: 'dict[int, Any]', has_tool_calls: 'dict[int, bool]', choice_logprobs: 'Optional[dict]', "
    "finish_reason_type: 'Optional[str]', usage: 'Optional[dict[str, Any]]') -> 'list[str]'",
    "sglang.srt.entrypoints.openai.serving_deepseek_recipe.DeepSeekRecipeChatEncodingAdapter"
    "._tool_call_id": "("
    "self, index: 'int', name: 'str', history_tool_calls_cnt: 'int') -> 'str'",
    "sglang.srt.entrypoints.openai.serving_deepseek_recipe.DeepSeekRecipeChatEncodingAdapter"
    "._new_output_parser": "("
    "self, request: 'ChatCompletionRequest') -> 'DeepSeekRecipeOutputParser'",
    "sglang.srt.entrypoints.openai.serving_deepseek_recipe._trailing_assistant_turn": "(messages: "
    "'list[dict[str, Any]]') -> 'Optional[dict[str, Any]]'",
    "sglang.srt.entrypoints.openai.serving_deepseek_recipe._null_content_as_empty": "(messages: "
    "'list[dict[str, Any]]') -> 'list[dict[str, Any]]'",
    "sglang.srt.parser.deepseek_recipe_renderer.DeepSeekRecipe"
    ".parse_start": "(self, *, thinking: 'bool', task: "
    "'Optional[str]' = None, continued: 'Optional[dict[str, Any]]' = None) -> 'Any'",
    "sglang.srt.entrypoints.openai.chat_encoding_adapters"
    ".select_new_output_ids": "(*, output_ids: 'list[int]', "
    "num_consumed_tokens: 'int', completion_tokens: 'int', finish_reason_type: 'Optional[str]', incremental: "
    "'bool') -> 'list[int]'",
    "sglang.srt.entrypoints.openai.chat_encoding_adapters"
    ".token_output_sse_chunks": "(*, chunk_id: 'str', created: "
    "'int', model: 'str', index: 'int', usage: 'Optional[dict[str, Any]]', logprobs: 'Optional[dict]', "
    "reasoning: "
    "'str', content: 'str', tool_calls: 'list[ToolCall]') -> 'list[str]'",
    "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._build_chat_response": "(self, request: "
    "'ChatCompletionRequest', ret: 'list[dict[str, Any]]', created: 'int') -> 'ChatCompletionResponse | "
    "ORJSONResponse'",
    "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat"
    "._generate_stream_content": "(self, content: "
    "'dict[str, Any]', index: 'int', request: 'ChatCompletionRequest', created: 'int', stream_offsets: "
    "'dict[int, int]', reasoning_parser_dict: 'dict', parser_dict: 'dict', has_tool_calls: 'dict[int, "
    "bool]', "
    "choice_logprobs: 'dict | None', finish_reason_type: 'str | None', continuous_usage_stats: 'bool', "
    "prompt_tokens: 'dict[int, int]', reasoning_tokens: 'dict[int, int]', completion_tokens: 'dict[int, "
    "int]') "
    "-> 'AsyncGenerator[str, None]'",
    "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat"
    "._generate_chat_stream": "(self, adapted_request: "
    "'GenerateReqInput', request: 'ChatCompletionRequest', raw_request: 'Request') -> "
    "'AsyncGenerator[str, None]'",
    "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._thinking_requested": "(self, request: "
    "'ChatCompletionRequest') -> 'bool'",
    "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat"
    "._get_reasoning_from_request": "(self, request: "
    "'ChatCompletionRequest') -> 'bool'",
    "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat"
    "._convert_to_internal_request": "(self, request: "
    "'ChatCompletionRequest', raw_request: 'Request' = None) -> 'tuple[GenerateReqInput, "
    "ChatCompletionRequest]'",
    "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat.handle_request": "(self, request: "
    "'OpenAIServingRequest', raw_request: 'Request') -> 'Union[Any, StreamingResponse, ErrorResponse]'",
    "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._process_messages": "(self, request: "
    "'ChatCompletionRequest', is_multimodal: 'bool', *, output_constrained: 'bool' = False) -> "
    "'MessageProcessingResult'",
    # The V4.1 Responses API output (plugin/serving/responses.py).
    f"{RECIPE_ADAPTER}.parse_responses_output": "(self, *, request: 'ResponsesRequest', require_reasoning: "
    "'bool', output_ids: 'list[int]', finish_reason: 'Optional[dict[str, Any]]', separate_reasoning: 'bool', "
    "parse_tool_calls: 'bool') -> 'tuple[str, str, list[ToolCallItem]]'",
    f"{RECIPE_ADAPTER}.new_responses_stream": "(self, *, request: 'ResponsesRequest', require_reasoning: "
    "'bool', separate_reasoning: 'bool', parse_tool_calls: 'bool') -> 'DeepSeekRecipeResponsesStream'",
    f"{RESPONSES}.OpenAIServingResponses._output_items": "(self, request: 'ResponsesRequest', "
    "reasoning_content: 'Optional[str]', content: 'Any', calls: 'list[ToolCallItem]', incomplete_calls: "
    "'set[int]', output_logprobs: 'Optional[list]') -> 'list'",
    f"{RESPONSES}._incomplete_tool_call_indices": "(parser) -> 'set[int]'",
    f"{RECIPE_ADAPTER}._new_responses_parser": "(self, request: 'ResponsesRequest', require_reasoning: "
    "'bool', separate_reasoning: 'bool', parse_tool_calls: 'bool') -> 'DeepSeekRecipeOutputParser'",
    "sglang.srt.entrypoints.openai.serving_deepseek_recipe.DeepSeekRecipeResponsesStream.step": "(self, "
    "chunk: 'dict[str, Any]', finish_reason: 'Optional[dict[str, Any]]') -> "
    "'tuple[str, str, list[ToolCallItem]]'",
    # The text-parsing endpoints (plugin/serving/text_endpoints.py).
    f"{RECIPE_ADAPTER}.separate_reasoning_text": "(self, text: 'str') -> 'tuple[str, str]'",
    f"{RECIPE_ADAPTER}.parse_function_call_text": "(self, text: 'str', tools: 'list[Tool]') -> "
    "'tuple[str, list[ToolCallItem]]'",
    # The thinking token budget (plugin/serving/thinking_budget.py).
    f"{GRAMMAR_MANAGER}._apply_request_reasoning_config": "(self, req: 'Req') -> 'None'",
    f"{GRAMMAR_MANAGER}.process_req_with_grammar": "(self, req: 'Req') -> 'bool'",
    f"{REASONER}.ReasonerGrammarBackend._make_grammar_object": "(self, grammar: "
    "Optional[sglang.srt.constrained.base_grammar_backend.BaseGrammarObject], reasoning: bool) -> "
    "sglang.srt.constrained.reasoner_grammar_backend.ReasonerGrammarObject",
    f"{REASONER}.ReasonerGrammarObject._can_think_more": "(self)",
    f"{REASONER}.ReasonerGrammarObject.fill_vocab_mask": "(self, vocab_mask: torch.Tensor, idx: int) -> None",
    f"{REASONER}.ReasonerGrammarObject.transfer_state": "(self, token: int) -> None",
    f"{REASONER}.ReasonerGrammarObject.rollback_state": "(self)",
    f"{XGRAMMAR_BACKEND}.apply_vocab_mask": "(logits: torch.Tensor, vocab_mask: torch.Tensor) -> None",
    f"{XGRAMMAR_BACKEND}.set_token_filter": "(vocab_mask: torch.Tensor, token_ids: List[int], "
    "batch_idx: int, is_allowed: bool = True, reset_vocab_mask: bool = True)",
    # Token-exact V4.1 tool-call grammars (plugin/serving/grammar_compile.py).
    f"{XGRAMMAR_BACKEND}.dispatch_structural_tag": "(self, key_string: str) -> "
    "sglang.srt.constrained.base_grammar_backend.BaseGrammarObject",
    f"{XGRAMMAR_BACKEND}._from_context": "(self, ctx: xgrammar.compiler.CompiledGrammar, key_string: str, "
    "grammar_stats: sglang.srt.constrained.base_grammar_backend.GrammarStats) -> "
    "sglang.srt.constrained.xgrammar_backend.XGrammarGrammar",
    # Incremental V4.1 prompt encoding (plugin/serving/prompt_encoding.py).
    f"{RENDERER}.DeepSeekRecipe.encode": "(self, body: 'dict[str, Any]', *, task: 'Optional[str]' = None, "
    "effort_budget: 'Optional[int]' = None, image_urls: 'Optional[list[str]]' = None) -> 'list[int]'",
    f"{RENDERER}.DeepSeekRecipe._replace_effort_budget": "(self, prompt_ids: 'list[int]', budget: 'int') -> "
    "'list[int]'",
    f"{RENDERER}.DeepSeekRecipe._attach_task": "(self, prompt_ids: 'list[int]', task: 'str', "
    "thinking: 'bool') -> 'list[int]'",
    f"{RENDERER}.pre_normalize": "(body: 'dict[str, Any]') -> 'dict[str, Any]'",
}

# method -> first 16 hex digits of sha256(inspect.getsource(method)) in SGLang 0.5.23
SOURCE_DIGESTS: Mapping[str, str] = {
    f"{EMBEDDING}.__init__": "2f6cde7545a375b7",
    f"{EMBEDDING}._init_host_table": "31ebcec93396cad5",
    f"{EMBEDDING}._load_rows": "ce49055e0d21304d",
    f"{EMBEDDING}.forward": "68f791628981ea39",
    f"{EMBEDDING}.dequant_staged": "539c744c8b29bfdd",
    f"{EMBEDDING}._owned_rows": "47211cf1e657646c",
    # The V4.1 chat output (plugin/serving/parsers.py) and thinking decision (plugin/serving/thinking.py).
    "sglang.srt.entrypoints.openai.serving_deepseek_recipe.DeepSeekRecipeChatEncodingAdapter"
    ".__init__": "26ef7ceb11e58015",
    "sglang.srt.entrypoints.openai.serving_deepseek_recipe.DeepSeekRecipeChatEncodingAdapter"
    ".parse_chat_response":
    "db80d1bd690f8c5d",
    "sglang.srt.entrypoints.openai.serving_deepseek_recipe.DeepSeekRecipeChatEncodingAdapter"
    ".stream_chat_chunks":
    "2ee5eac475731ce7",
    "sglang.srt.entrypoints.openai.serving_deepseek_recipe.DeepSeekRecipeChatEncodingAdapter"
    "._new_output_parser":
    "85dd6b28e9e22927",
    "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._build_chat_response": "ac2d10c00a096e17",
    "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat"
    "._generate_stream_content": "1fc8c581c45580d6",
    "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._generate_chat_stream": "26de62556f6b0ad4",
    "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._thinking_requested": "dbf0de8b1cf1451b",
    "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat"
    "._get_reasoning_from_request": "b6a90e63fc849e06",
    "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat"
    "._convert_to_internal_request": "ec9c8aec44637162",
    "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat.handle_request": "f47d3e8fad409f77",
    "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._process_messages": "00296c1f9bed5732",
    f"{XGRAMMAR_BACKEND}.dispatch_structural_tag": "464dce13b1c1ab5a",
    # plugin/serving/responses.py re-implements these (the parse recipe's parser is built with, the step).
    f"{RECIPE_ADAPTER}.parse_responses_output": "7243ce8a23f4a870",
    f"{RECIPE_ADAPTER}._new_responses_parser": "2fb60c9242f0e11f",
    "sglang.srt.entrypoints.openai.serving_deepseek_recipe.DeepSeekRecipeResponsesStream"
    ".step": "d12bca50853c757c",
    f"{RESPONSES}._incomplete_tool_call_indices": "be6f54ecf863dbfd",
    # plugin/serving/thinking_budget.py relies on how these count and force the end of the reasoning.
    f"{GRAMMAR_MANAGER}._apply_request_reasoning_config": "67b43794b6924bb4",
    f"{GRAMMAR_MANAGER}.process_req_with_grammar": "5341c5932fae0666",
    f"{REASONER}.ReasonerGrammarBackend._make_grammar_object": "6204ecbb56a20ebc",
    f"{REASONER}.ReasonerGrammarObject._can_think_more": "7bf78692306aa39a",
    f"{REASONER}.ReasonerGrammarObject.fill_vocab_mask": "4f2d5be14afb6cfb",
    f"{REASONER}.ReasonerGrammarObject.transfer_state": "f9e3a320ec2551f3",
    f"{REASONER}.ReasonerGrammarObject.rollback_state": "095a9366e0819f4d",
    # plugin/serving/prompt_encoding.py re-implements encode (its rendering), and pre_normalize's
    # rules for messages.
    f"{RENDERER}.DeepSeekRecipe.encode": "11a3ccf23045f1d1",
    f"{RENDERER}.pre_normalize": "5593160d09577c1d",
    # plugin/serving/text_endpoints.py re-implements these.
    f"{RECIPE_ADAPTER}.separate_reasoning_text": "c6962c58857ba40c",
    f"{RECIPE_ADAPTER}.parse_function_call_text": "e930b84beb9ae0fb",
}


class UpstreamMismatch(Ds41Error):
    """The installed SGLang is not the one the plugin was written against."""


def resolve_upstream(name: str) -> object:
    """`name` in upstream's own code, also after the plugin replaced `EngramEmbedding` (then the
    upstream class is the replacement's base)."""
    cls_path = EMBEDDING
    if name != cls_path and not name.startswith(cls_path + "."):
        return pkgutil.resolve_name(name)
    cls = pkgutil.resolve_name(cls_path)
    original = next(
        (c for c in cls.__mro__ if c.__module__ == ENGRAM and c.__name__ == "EngramEmbedding"), cls
    )
    for attr in name[len(cls_path) :].split(".")[1:]:
        original = getattr(original, attr)
    return original


def source_digest(obj: object) -> str:
    return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()[:16]


def differences(
    version: str,
    resolve=resolve_upstream,
    signatures: Mapping[str, str] = SIGNATURES,
    digests: Mapping[str, str] = SOURCE_DIGESTS,
) -> list[str]:
    """Every way the installed SGLang differs from what the plugin expects (empty: none)."""
    found = []
    if version != SGLANG_VERSION:
        found.append(f"sglang {version} is installed, the plugin is written against sglang=={SGLANG_VERSION}")
    for name, expected in signatures.items():
        try:
            obj = resolve(name)
        except (ImportError, AttributeError) as error:
            found.append(f"{name}: missing ({error})")
            continue
        got = str(inspect.signature(obj))
        if got != expected:
            found.append(f"{name}: signature {got}, expected {expected}")
    for name, expected in digests.items():
        try:
            got = source_digest(resolve(name))
        except (ImportError, AttributeError, OSError, TypeError) as error:
            found.append(f"{name}: source unavailable ({error})")
            continue
        if got != expected:
            found.append(f"{name}: source changed (digest {got}, expected {expected})")
    return found


def check() -> None:
    """Raise `UpstreamMismatch` listing every difference, before the plugin hooks anything."""
    import sglang

    found = differences(getattr(sglang, "__version__", "unknown"))
    if found:
        raise UpstreamMismatch(
            "sglang-ds41's SGLang plugin (MXFP4/NVFP4 Engram tables) cannot hook this SGLang:\n  "
            + "\n  ".join(found)
            + f"\nInstall sglang=={SGLANG_VERSION} (pip install 'sglang-ds41[gpu]'), or disable the plugin "
            "with SGLANG_PLUGINS set to the plugins you want (it then serves FP8 Engram tables only)."
        )

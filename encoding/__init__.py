"""The DeepSeek-V4.1 prompt format, imported as `sglang_ds41.encoding`.

A pipeline of pure stages, byte-exact with the official renderer `deepseek-recipe`:
OpenAI chat request -> Conversation -> RenderedPrompt (text + special spans) -> token ids;
and the way back: completion text or ids -> reasoning / content / tool calls.
"""

"""Agent runner over the OpenAI client, imported as `sglang_ds41.agents` (not `agents`)."""

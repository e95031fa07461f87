"""The emulated engine server: the simulator's engine model on a scaled wall clock behind vLLM's
OpenAI-compatible API, with vLLM's KV events and metrics (``kvtide engine``)."""

"""gateway: the LLM-aware OpenAI-compatible data plane."""

"""engine: the reference inference engine (vLLM API subset on a real torch model)."""

"""Demo: decode SmolLM2-135M-Instruct (a GGUF file shipped on PyPI) with ddtree."""

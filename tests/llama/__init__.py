"""A real model in the tests: SmolLM2-135M on llama.cpp behind an Ollama-wire server."""

"""The Ollama client."""

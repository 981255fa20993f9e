"""llmload: load-testing and regression suite for LLMs behind OpenAI-compatible endpoints."""

__version__ = "0.1.0"

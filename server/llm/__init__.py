"""The language model served: OpenAI-style completions and client–server verification."""

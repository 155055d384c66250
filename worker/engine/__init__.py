"""The serving engine: requests in, tokens out, over a model, a KV cache and a scheduler."""

"""The network: the Llama-family decoder with its KV cache, and its config."""

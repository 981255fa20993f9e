"""The servers llmload speaks to (vLLM, transformers serve, llama.cpp's llama-server, ...), each in
its own terms.

- ``kinds``: the kinds of ``kinds.yaml`` as typed rows: what each accepts, streams and exports.
- ``detect``: which kind is behind a URL, from a few requests that cannot change it.
- ``request``: the chat request a server of a given kind is sent.
"""

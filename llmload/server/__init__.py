"""The server under test, described once: the settings it runs with and the kind it is.

Its settings are one `ServeConfig` (llmload/models/serving.py), read as vLLM reads them, whatever they come
from; what a kind of server accepts, streams and exports sits beside them, so everything llmload
knows about a server is in this room:

- ``serve_config``: ``read_serve_config`` turns a `vllm serve --config` YAML, a command line and
  single setting flags into a ``ServeConfig``, refusing what vLLM would refuse, with the file and line.
- ``vllm_options``: the options vLLM accepts and how each value is read, from a capture of the vLLM
  the tests run (``vllm-<version>.json``, refreshed by ``capture``).
- ``arguments``: the same settings as every command's flags, generated from ``ServeConfig``.
- ``kinds``: the kinds of server in ``kinds.yaml`` (vLLM, transformers serve, llama.cpp's
  llama-server, ...) as typed rows: what each accepts, streams and exports.
- ``detect``: which kind is behind a URL, from a few requests that cannot change it.
- ``request``: the chat request a server of a given kind is sent.
- ``cache_reset``: its prefix cache emptied before a run, where its kind offers a reset.
- ``reach``: whether a connection to it opens (and its TLS handshake passes) before a run sends it anything.
"""

"""Watching the target while a run goes, and what a report says of it afterwards.

- `metrics`: Prometheus text (vLLM, the simulator, a DCGM exporter) fetched and reduced to figures
- `gpu`: the GPU readers (a DCGM exporter, else NVML or nvidia-smi on this machine) and `GpuSample`
- `host`: this machine's CPU between two samples (`HostMeter`), and the hypervisor's steal over a run (`StealMeter`)
- `scraper`: one replica's /health and /metrics (`ReplicaScraper`), and the fleet's figures over every replica
- `observer`: the loop that writes server.jsonl (`Observer`, one `ServerSample` a line)
- `summary`: server.jsonl read back (`ServerSamples`) and summary.json's `server` block
"""

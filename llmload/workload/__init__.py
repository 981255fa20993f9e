"""Workloads: the file format (v1), loading, synthesis (`synth`), building from request logs
(`formats`, `build`), statistics (`stats`) and the `workload build|stats` commands (`cli`).

Only the file API is imported here, so that loading a workload stays light."""

from llmload.workload.files import Workload, WorkloadError, load_workload, save_workload

__all__ = ["Workload", "WorkloadError", "load_workload", "save_workload"]

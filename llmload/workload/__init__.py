"""Workloads: the file format (v1), loading, synthesis; building from logs arrives with issue 3."""

from llmload.workload.files import Workload, WorkloadError, load_workload, save_workload

__all__ = ["Workload", "WorkloadError", "load_workload", "save_workload"]

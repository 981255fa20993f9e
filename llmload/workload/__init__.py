"""Workloads: the file format (v1) and loading (`files`), synthesis (`synth`) from
distributions (`distributions`) or like a real workload (`like`; a trace of block ids by its whole
conversations: `like_blocks`), building from request logs
(`formats`, `build`), statistics (`stats`), the reusable prefix an infinite prefix cache could
serve (`prefix`), token counts (`tokens`), the markers that keep replays of a session from
warming each other's cache (`cache_bust`), every length times F for `--scale-tokens` (`scale`),
think times for `--use-think-time-only` and `--max-think-time` (`pacing`), and the text of prompts
given as prefix block ids (`blocks`); the `workload` commands are in llmload/cli/workload.py.

Only the file API is imported here, so that loading a workload stays light."""

from llmload.workload.files import Workload, WorkloadError, load_workload, save_workload

__all__ = ["Workload", "WorkloadError", "load_workload", "save_workload"]

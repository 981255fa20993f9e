"""The sample workload's files, package data (llmload.packaged names them)."""

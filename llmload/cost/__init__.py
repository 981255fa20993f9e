"""What an answer costs: the GPUs' energy over each stage and the hold (their energy counters, or
their power integrated), and the price of the GPU-hours they took, per output and input token."""

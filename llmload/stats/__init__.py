"""Statistics every report and gate shares: exact percentiles of columns, per-window reductions,
least-squares trends, and log-linear histograms for the ITL gaps no run can hold in memory."""

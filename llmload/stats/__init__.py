"""Statistics every report and gate shares: exact percentiles of columns (`percentiles`), per-window
reductions (`windows`), least-squares trends (`trend`), and log-linear histograms for the ITL gaps
no run can hold in memory (`sketch`)."""

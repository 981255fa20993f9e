"""What a run's records become: the summary (computed once), report.md and report.html, and the
capacity search's page."""

"""`make bench`: measurements of llmload itself (speed and timing honesty), printed as tables."""

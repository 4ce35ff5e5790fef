"""timeslice."""

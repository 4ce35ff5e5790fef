"""scheduler_extender."""

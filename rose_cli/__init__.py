"""rose_cli."""

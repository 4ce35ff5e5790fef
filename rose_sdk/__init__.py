"""rose_sdk."""

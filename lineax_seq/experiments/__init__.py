"""Command-line experiments behind `python -m lineax_seq` (not part of the library API)."""

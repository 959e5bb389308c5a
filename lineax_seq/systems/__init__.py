"""`lineax_seq.systems`."""

__all__: list[str] = []

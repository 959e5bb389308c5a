"""`lineax_seq.data`."""

__all__: list[str] = []

"""`lineax_seq.attention`."""

__all__: list[str] = []

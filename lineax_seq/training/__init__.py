"""`lineax_seq.training`."""

__all__: list[str] = []

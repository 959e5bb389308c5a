"""`lineax_seq.bst`."""

__all__: list[str] = []

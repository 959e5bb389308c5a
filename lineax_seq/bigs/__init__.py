"""`lineax_seq.bigs`."""

__all__: list[str] = []

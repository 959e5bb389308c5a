"""`lineax_seq.koopman`."""

__all__: list[str] = []

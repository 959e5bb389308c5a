"""`lineax_seq.ssm`."""

__all__: list[str] = []

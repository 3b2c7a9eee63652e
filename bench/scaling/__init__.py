"""The scaling model (pure arithmetic), its constants measured here, projections to many workers and GPUs."""

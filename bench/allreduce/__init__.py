"""The allreduce engine's parts: the ring, overlap, row gather, rendezvous, stages, XLA's collectives."""

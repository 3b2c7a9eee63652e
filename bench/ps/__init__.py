"""The parameter server's parts alone: transport, row work, shards, half-width wire, a worker's push."""

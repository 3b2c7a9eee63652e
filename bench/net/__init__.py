"""What TLS costs the transports."""

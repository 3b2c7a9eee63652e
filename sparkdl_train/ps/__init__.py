"""Parameter server hosted on the driver: protocol, update rules, server and executor client."""

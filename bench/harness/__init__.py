"""What every benchmark shares: a Spark session with the tests' settings, a result writer, the docs' tables."""

"""Executor-side code. Nothing here imports the driver package or touches Spark's driver APIs."""

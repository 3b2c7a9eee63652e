"""Driver-side code: the user-facing SparkModel and the engines that run a fit."""

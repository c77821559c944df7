"""Benchmark suites shipped with bat_gym; each registers itself through an entry point."""

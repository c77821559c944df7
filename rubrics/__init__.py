"""Rubric contracts as versioned data, the checks they name, and the verifier."""

"""The built-in rubric checks, one module per kind of evidence."""

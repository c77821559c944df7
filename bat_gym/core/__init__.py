"""The public core beneath a benchmark.

Errors, plugins, the spec, the wire protocol and tools, records, services, the tool
runner and the sandboxes: what a benchmark, its rubric contracts and every layer
above stand on.
"""

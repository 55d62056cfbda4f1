"""The hosts file and the YAML data files: read with line numbers, validated by
pydantic, every problem reported as ``file:line: field: expected, got``.
"""

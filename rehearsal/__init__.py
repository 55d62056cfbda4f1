"""The GPU rehearsal: what runs the tool against real SGLang on a GPU host (issue 12).

Stdlib only where it runs on the GPU host (no network there, and only the host's own Python).
"""

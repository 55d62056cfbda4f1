"""overlay: move a CUDA lane (torch, triton, the nvidia packages, ...) between venvs.

Lane files (lane.py), manifests from RECORD (manifest.py, running remote/overlay_manifest.py),
the plan (plan.py), its rendering (render.py); the shared shapes are in model.py.
"""

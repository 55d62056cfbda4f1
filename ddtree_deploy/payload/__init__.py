"""The DDTree runtime as a deployable payload: manifest, patching, deploy/verify/rollback."""

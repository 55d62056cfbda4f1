"""ddtree-deploy: get a DDTree build of SGLang running on GPU hosts over SSH."""

__version__ = "0.1.0"

"""DDTree speculative decoding for SGLang 0.5.17+, as a plugin SGLang loads itself.

SGLang calls :func:`ddtree_sglang.plugin.load` (entry point ``ddtree`` in the group
``sglang.srt.plugins``) in every process it starts; ``load`` registers the algorithm ``DDTREE``
through ``SpeculativeAlgorithm.register`` (nothing in the sglang package is written). The DDTree
core (tree build, compile, walk, sampling, graphs) is the shared ``ddtree`` package, the same
files the 0.5.11 patch set maps into SGLang. Which releases are served: ``releases``.
"""

__version__ = "0.3.5"

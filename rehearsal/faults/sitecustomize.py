"""Fault injection for the rehearsal's negative controls (never part of the payload).

Put this folder on PYTHONPATH with REHEARSAL_FAULT set and every Python process of the server
(the scheduler too: it inherits the environment) loads it at start-up. It wraps one payload
function as soon as its module is loaded, before any other module imports it by name:

* ``mask``: the tree's verify mask off by one (slot i also sees slot i + 1, a sibling or an
  unrelated node); a context-sensitive target must then answer differently.
* ``greedy-follow``: sampled requests follow the target's argmax (the payload before 0.2.0).
* ``hot``: the sampler ignores the request's temperature (a biased sampler).
* ``topk-shortcut``: payload 0.2.2's dense shortcut, keyed on the batch's *largest* top-k: a
  top-k 2 request beside requests that leave top-k unset samples the whole vocabulary
  (issue 25's first finding; the request-parameter phase must fail it).
* ``admit-penalties``: admission lets penalties and min_new_tokens through, and the payload
  ignores them (payload 0.2.2: its penalizer is never advanced); the phase must fail it.

(An A/B of the payload itself, e.g. its round graphs off, is a server environment variable:
``rehearsal/lineup.py`` EAGER_ROUND.)
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

FAULT = os.environ.get("REHEARSAL_FAULT", "")
# Each fault's module in the 0.5.11 patch set (mapped into SGLang) and in the plugin form
# (ddtree-sglang-plugin: the shared core as ``ddtree``, the verify round as ddtree_sglang.verify).
_VERIFY = ("sglang.srt.speculative.ddtree_verify", "ddtree_sglang.verify")
_SAMPLING = ("sglang.srt.speculative.ddtree_sampling", "ddtree.sampling")
_MODULES = {
    "mask": _VERIFY,
    "greedy-follow": _SAMPLING,
    "hot": _SAMPLING,
    "topk-shortcut": _SAMPLING,
    "admit-penalties": ("sglang.srt.speculative.ddtree_admission", "ddtree.admission"),
}


def _patch(module):  # type: ignore[no-untyped-def]
    if FAULT == "mask":
        original = module.tree_custom_mask

        def tree_custom_mask(mask, prefix_lens, total, index=None):  # type: ignore[no-untyped-def]
            shifted = mask.clone()
            n = mask.shape[1]
            rows = [i for i in range(n - 1)]
            shifted[:, rows, [i + 1 for i in rows]] = True
            return original(shifted, prefix_lens, total, index)

        module.tree_custom_mask = tree_custom_mask
    elif FAULT == "greedy-follow":

        def sample_tokens(logits, temperatures, top_ks, top_ps, min_ps=None, **kw):  # type: ignore[no-untyped-def]
            return logits.argmax(dim=-1)

        module.sample_tokens = sample_tokens
    elif FAULT == "hot":
        original_sample = module.sample_tokens

        def sample_tokens(logits, temperatures, top_ks, top_ps, min_ps=None, **kw):  # type: ignore[no-untyped-def]
            return original_sample(logits, temperatures * 0 + 1, top_ks, top_ps, min_ps, **kw)

        module.sample_tokens = sample_tokens
    elif FAULT == "topk-shortcut":
        fair = module.sample_tokens

        def sample_tokens(logits, temperatures, top_ks, top_ps, min_ps=None, **kw):  # type: ignore[no-untyped-def]
            kw["min_top_k"] = kw.get("max_top_k")  # the shortcut keyed on the largest top-k
            return fair(logits, temperatures, top_ks, top_ps, min_ps, **kw)

        module.sample_tokens = sample_tokens
    elif FAULT == "admit-penalties":
        strict = module.check_sampling
        let_through = ("frequency_penalty", "presence_penalty", "repetition_penalty",
                       "min_new_tokens")

        def check_sampling(params):  # type: ignore[no-untyped-def]
            return strict({k: v for k, v in (params or {}).items() if k not in let_through})

        module.check_sampling = check_sampling
    sys.stderr.write(f"REHEARSAL FAULT ACTIVE: {FAULT} in {module.__name__} (pid {os.getpid()})\n")


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name not in _MODULES.get(FAULT, ()):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module):  # type: ignore[no-untyped-def]
            run(module)
            _patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if FAULT in _MODULES:
    sys.meta_path.insert(0, _Finder())

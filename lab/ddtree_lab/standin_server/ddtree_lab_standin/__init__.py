"""Lab-only stand-in pieces for SGLang (distribution ``ddtree-lab-standin``).

This machine and the lab containers have no GPUs and cannot carry multi-GB torch
wheels, so the lab installs the real small wheels (sglang --no-deps, xgrammar,
flashinfer-python, soundfile, nvidia runtimes) plus this package. A ``.pth`` file
registers :mod:`ddtree_lab_standin.hook`, which serves our light ``sglang`` init
and ``sglang.launch_server`` while every other ``sglang.*`` module still loads
from the real, untouched files. Nothing here is ever installed on a real host.
"""

__version__ = "0.1.0"

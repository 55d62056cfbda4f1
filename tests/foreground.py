"""Start a command with SIGINT at its default, as a terminal starts its foreground job.

A shell without job control (a CI script, `bash -c 'pytest ... &'`, `nohup ... &`) starts
background commands with SIGINT and SIGQUIT ignored, and an ignored signal stays ignored across
fork and exec: pytest, and every process a test starts, then inherits it. Python installs its
KeyboardInterrupt handler only where SIGINT was at its default when it started, and
ddtree-deploy keeps a SIGINT its caller ignored (that is what the caller asked for), so a test
that sends SIGINT, as Ctrl-C does, must start the command the way a terminal would. CI saw it:
bench's Ctrl-C tests failed (exit 0 and 1, the sweep running on) while their SIGTERM twins
passed.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

# Sets SIGINT to its default, then becomes the command (same PID: signals sent to the Popen's
# pid reach the command itself).
_EXEC = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
         "os.execvp(sys.argv[1], sys.argv[1:])")


def sigint_default(argv: Sequence[str]) -> list[str]:
    """`argv` run with SIGINT at its default, whatever this process inherited."""
    return [sys.executable, "-S", "-c", _EXEC, *argv]

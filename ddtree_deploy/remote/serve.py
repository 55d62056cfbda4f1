"""Run SGLang's server with its API key kept out of its log: run ON the host by the venv's
python as the unit's ExecStart (`python serve.py ARGS... --config FILE`), stdlib only.

SGLang reads the key from the --config file (never argv: /proc/PID/cmdline shows the path
only), then logs its whole ServerArgs at start-up (`server_args=ServerArgs(..., api_key=...)`
in sglang/srt/entrypoints/engine.py). This launcher makes ServerArgs' text show every key as
'<hidden>' before `sglang.launch_server` runs as __main__, exactly as `python -m` runs it.
"""

import importlib
import runpy
import sys

HIDDEN = "'<hidden>'"
SECRET_FIELDS = ("api_key", "admin_api_key")


def hide_keys() -> None:
    """ServerArgs.__repr__ with the secret fields' values shown as '<hidden>'."""
    try:  # the venv's sglang, found at run time (this script itself needs only the stdlib)
        server_args = importlib.import_module("sglang.srt.server_args")
    except Exception:  # an sglang that cannot import says so itself, in launch_server
        return
    cls = getattr(server_args, "ServerArgs", None)
    if cls is None:
        return
    shown = cls.__repr__

    def masked(self):
        text = shown(self)
        for name in SECRET_FIELDS:
            value = getattr(self, name, None)
            if value:
                text = text.replace(f"{name}={value!r}", f"{name}={HIDDEN}")
        return text

    cls.__repr__ = masked


def main() -> None:
    hide_keys()
    sys.argv = ["sglang.launch_server", *sys.argv[1:]]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

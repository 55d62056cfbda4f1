"""Everything that runs ON a host: stdlib-only scripts, and the one way they are run.

Naming: `<area>.py` is a script's entry (it has main), `<area>_<part>.py` a part bundled with it
(remote/bundle.py joins them into one file); a single-file script is `<area>_<what>.py`. Every
module here runs on the host's own python (3.8 and later: no match, no walrus in
comprehensions, no new typing at run time) with nothing but the standard library; they import
each other as ordinary modules so the workstation's tests can call their functions.
The workstation sends a script and reads its one JSON answer with remote/runner.py's run_json.
"""

"""How one SGLang server is started: ServerSettings, one strict model validated once.

- ``values.py``: the single values (ranges, paths, environment names) hosts.yaml shares;
- ``model.py``: ServerSettings, its rules between fields, and the rules that need the host's
  facts (run with a HostFit as the validation context);
- ``layers.py``: the one merge (the host's defaults, a file, then flags) with its messages;
- ``command.py``: the server's argv AND environment, knowing the SGLang version;
- ``messages.py``: pydantic's errors said in plain English.

Below config, service, rules and bench: it imports only errors (and pydantic, packaging).
"""

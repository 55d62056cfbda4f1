"""SGLang services on hosts: the spec, its systemd unit, install, and the health probe."""

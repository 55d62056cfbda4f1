"""The lab: a rehearsal of the story's hosts (ct129, ct200) on this machine.

Real parts wherever this machine has them: systemd-nspawn containers booted with
systemd, journald and OpenSSH, each in its own network namespace, and real small
wheels from the registry. Stand-ins only where the hardware or the download is
missing (GPUs, torch, sglang-kernel, big CUDA libraries, server start-up): see
standin/, standin_wheels.py and standin_server/.

Nothing outside this package knows about the lab: the rest of the tool sees the
hosts through hosts.yaml and SSH like any other host.
"""

"""The prose of docs/troubleshooting.md that the code does not hold: what a doctor finding
means and how to fix it, and the tool's most common error messages.

scripts/gen_troubleshooting.py joins it with what the code does hold (each finding's id,
severity and message, each crash signature); tests/test_docs_reference.py fails when a finding
id of ddtree_deploy/rules/ has no entry here, when an entry names an id no rule makes, and
when an error text below no longer occurs in the tool's source.
"""

from __future__ import annotations

# A doctor finding id -> (what it means, the fix). The fix the tool prints is filled in for
# the host; the one here is its general form.
DOCTOR: dict[str, tuple[str, str]] = {
    "nvidia.absent": (
        "Neither NVML nor nvidia-smi answered on the host: no driver is loaded (or none is "
        "installed), so no GPU is seen.",
        "Install or load the NVIDIA driver (R580+ for the cu130 lane), then "
        "`ddtree-deploy doctor HOST --refresh`."),
    "gpu.dead": (
        "A GPU is listed but does not answer (an Xid error, fallen off the bus, "
        "`nvidia-smi` shows ERR!). A service placed on it cannot start.",
        "Keep services off it (`ddtree-deploy service up HOST NAME --gpu N` with a live GPU; "
        "`ddtree-deploy inventory HOST` lists them); the card needs a reboot or a reseat."),
    "driver.too-old": (
        "The driver is older than the CUDA lane of a venv or of the deployment needs (a CUDA "
        "13 lane such as cu130 needs R580+, a CUDA 12 lane R525+): CUDA fails to initialise.",
        "Upgrade the driver, or keep the venv on a lane the driver serves "
        "(`ddtree-deploy overlay --abi cu128 --to HOST --venv VENV`)."),
    "host.units-unreadable": (
        "systemctl (or the tool's unit folder) did not answer, so which services run and which "
        "units hold GPUs and ports is unknown, not empty.",
        "Check systemd on the host (`systemctl status`); on a host without systemd run "
        "services in plain mode; then `ddtree-deploy doctor HOST --refresh`."),
    "venv.missing": (
        "The venv path (from --venv or the deployment's venv in hosts.yaml) does not exist on "
        "the host.",
        "Fix the path, or create the venv: `ddtree-deploy venv clone HOST SOURCE DEST`, or "
        "declare `venvs.NAME.create` in hosts.yaml and run `ddtree-deploy apply HOST`."),
    "venv.unreadable": (
        "Part of the venv (its site-packages, a package's metadata) could not be read, so "
        "other rules may miss problems.",
        "Check the path and its permissions for the deploy user, then "
        "`ddtree-deploy doctor HOST --venv VENV` again."),
    "venv.lane-mix": (
        "The venv mixes CUDA majors: torch is built for one (say cu128) while compiled "
        "extensions (sgl_kernel, flashinfer) need another's libraries. SGLang then fails with "
        "`cannot open shared object file` or `undefined symbol` (see abi-missing-cuda-library).",
        "Move the whole lane in: `ddtree-deploy overlay --abi LANE --to HOST --venv VENV`."),
    "venv.kernel-torch": (
        "sgl-kernel (or another compiled package) is built for one torch release and the venv "
        "has another: its C++ symbols will not resolve at import. An error when the package "
        "declares the pin, a warning when the tool knows it from the wheels.",
        "Install the lane's torch with the overlay (`ddtree-deploy overlay --abi LANE --to HOST "
        "--venv VENV`), or pin torch in the deployment's `sglang.extra_packages` and "
        "`ddtree-deploy apply HOST`."),
    "venv.pin-drift": (
        "The venv's packages differ from what the installed sglang release pins (a package "
        "upgraded or missing). It may still run; crashes then are hard to place.",
        "`ddtree-deploy apply HOST` installs the release's pins; a pin you changed on purpose "
        "goes into `sglang.extra_packages` (then it is no longer reported)."),
    "venv.soundfile-missing": (
        "sglang's HTTP server imports soundfile at start-up (0.5.11); without it the server "
        "exits with `No module named 'soundfile'`.",
        "Add `soundfile==0.13.1` to the deployment's `sglang.extra_packages` and "
        "`ddtree-deploy apply HOST`."),
    "venv.flashinfer-mxfp8": (
        "flashinfer-python is older than 0.6.4 and has no `mm_mxfp8`, which sglang imports on "
        "Blackwell GPUs: an error on a host with such GPUs, a warning elsewhere.",
        "Add `flashinfer-python>=0.6.4` to `sglang.extra_packages` and "
        "`ddtree-deploy apply HOST`."),
    "venv.xgrammar-structural-tag": (
        "xgrammar is older than the sglang release's grammar backend needs (no StructuralTag): "
        "an error when the deployment uses the xgrammar backend (the default), info when it "
        "names another.",
        "`ddtree-deploy service up HOST NAME --grammar-backend none`, or add a newer xgrammar "
        "to `sglang.extra_packages` and `ddtree-deploy apply HOST`."),
    "venv.flashinfer-sm12": (
        "An SM 12.x GPU (RTX 50xx, RTX PRO 6000) with a CUDA older than 12.9: FlashInfer's JIT "
        "refuses the GPU. An error when the deployment uses FlashInfer attention, a warning "
        "when it names none, info when it names another backend.",
        "`ddtree-deploy service up HOST NAME --attention-backend triton` (or set "
        "`attention_backend: triton` in hosts.yaml)."),
    "deploy.gpu-missing": (
        "The deployment's `gpu` names an index the host does not have.",
        "Set `gpu` in hosts.yaml to an existing GPU (`ddtree-deploy inventory HOST`), or "
        "`ddtree-deploy service up HOST NAME --gpu N`."),
    "deploy.gpu-dead": (
        "The deployment's `gpu` names a GPU that does not answer (see gpu.dead).",
        "Move it to a live, free GPU: `gpu` in hosts.yaml, or "
        "`ddtree-deploy service up HOST NAME --gpu N`."),
    "deploy.gpu-busy": (
        "Another process (not this deployment's unit) holds memory on the deployment's GPU: "
        "the server would run short of memory or crash with `CUDA out of memory`.",
        "Pick a free GPU (the finding names one), or stop the other process; "
        "`service up --force` shares the GPU anyway."),
    "deploy.tp-gpus": (
        "A tensor-parallel deployment without `gpu`: info names the free, contiguous GPUs it "
        "will get; an error says there is no such run of tp_size free GPUs.",
        "Free GPUs, or set `tp_size` (or `gpu`) in hosts.yaml and `ddtree-deploy apply HOST`."),
    "deploy.port-taken": (
        "The deployment's port is held by another process; the server would fail with "
        "`address already in use` (see port-in-use).",
        "Set another `port` in hosts.yaml (the finding suggests a free one) or stop the holder."),
    "deploy.python": (
        "The sglang release's wheels need another Python than the venv has.",
        "Give the venv a fitting Python (`venvs.NAME.create.python` in hosts.yaml) and "
        "`ddtree-deploy apply HOST`, or choose another `sglang.version`."),
    "deploy.glibc": (
        "The sglang release's wheels are built for a newer glibc (manylinux tag) than the "
        "host has: pip cannot install them.",
        "Deploy to a host with a newer OS, or choose a release whose wheel fits."),
    "deploy.lane-mismatch": (
        "The deployment wants one CUDA lane (`cuda_lane`) and the venv's torch is built for "
        "another.",
        "`ddtree-deploy overlay --abi LANE --to HOST --venv VENV` with the deployment's lane."),
    "deploy.sglang-missing": (
        "The deployment's venv has no sglang installed.",
        "`ddtree-deploy apply HOST` installs the declared `sglang.version`."),
    "deploy.sglang-version": (
        "The venv's sglang differs from the deployment's `sglang.version`.",
        "`ddtree-deploy apply HOST` installs the declared release."),
    "deploy.no-dflash": (
        "The installed sglang predates DFlash (first in 0.5.11), which DFLASH and DDTREE "
        "build on.",
        "Set `sglang.version` to 0.5.11 or later and `ddtree-deploy apply HOST`."),
    "deploy.ddtree-attention": (
        "Full-tree DDTREE verification runs only on the triton attention backend; the "
        "deployment names another (in `attention_backend` or `extra_args`), which the payload "
        "refuses at start. Info with `ddtree.shadow_linear: true`, which verifies the chain "
        "with any backend.",
        "Set `attention_backend: triton` (or leave it out) and `ddtree-deploy apply HOST`, or "
        "`ddtree.shadow_linear: true`."),
    "deploy.ddtree-verify-width": (
        "The DDTREE budget + 1 (the verify width) is below the drafter's block size: SGLang "
        "sizes KV slots and CUDA graphs for the narrower width while the drafter writes a whole "
        "block, and under memory pressure `DFLASH draft OOM` kills the scheduler.",
        "Raise `ddtree.budget` to at least block size - 1 (the finding names it) and "
        "`ddtree-deploy apply HOST`, or set `ddtree.shadow_linear: true`."),
    "deploy.venv-role": (
        "The deployment serves from a venv whose role is not `serving`: plan and apply will "
        "not write into it (packages, lane, payload); serving from it is allowed.",
        "Serve from a clone (`venvs.NAME.create: {clone: SOURCE}`, role serving), or set "
        "`allow_writes: true` on the venv to let the tool change it."),
    "deploy.config-needs-yaml": (
        "The deployment gives SGLang its API key in a `--config` file, which SGLang reads with "
        "PyYAML, and the venv has no pyyaml: the server would not start.",
        "Add `pyyaml` to `sglang.extra_packages` and `ddtree-deploy apply HOST`."),
    "deploy.open-endpoint": (
        "The server listens on every interface without an API key: anyone who reaches the "
        "port can use the model.",
        "Set `api_key_file` for the deployment (a file on the workstation), or `bind: "
        "127.0.0.1`; then `ddtree-deploy apply HOST`."),
    "payload.sglang-unsupported": (
        "The deployment asks for DDTREE on an sglang release the payload does not serve: it "
        "ships a patch set for 0.5.11 and a plugin for 0.5.17 and later (docs/architecture.md).",
        "Set `sglang.version` to a supported release and `ddtree-deploy apply HOST`."),
    "payload.plugin-missing": (
        "The sglang in the venv takes DDTree as a plugin (0.5.17+), and none is installed or "
        "its files changed since it was.",
        "`ddtree-deploy payload deploy HOST --venv VENV`."),
    "payload.ddtree-missing": (
        "The sglang in the venv (0.5.11) does not know the DDTREE speculative algorithm: the "
        "payload's patch set is not applied. The server would exit with `invalid choice: "
        "'DDTREE'`.",
        "`ddtree-deploy payload deploy HOST --venv VENV` (and `payload: true` on the "
        "deployment, so apply keeps it)."),
    "payload.ddtree-unknown": (
        "The probe could not import sglang's speculative module to ask whether it knows "
        "DDTREE (the error is in the finding).",
        "Fix what the error names (often a missing package), or redeploy the payload: "
        "`ddtree-deploy payload deploy HOST --venv VENV`."),
    "payload.ddtree-not-dflash": (
        "DDTREE is registered but not treated as DFlash, so the draft would get one layer's "
        "hidden states instead of the concatenated ones: a half-applied or foreign patch.",
        "`ddtree-deploy payload deploy HOST --venv VENV`."),
    "model.*-config-missing": (
        "The target (`*` = target) or draft (`*` = draft) model's config.json could not be "
        "read at the path hosts.yaml gives.",
        "Copy the model to that path on the host, or fix `model_path` / `draft_model_path`."),
    "model.hidden-size-mismatch": (
        "The draft's hidden_size differs from the target's: the drafter was trained for "
        "another target model.",
        "Point `draft_model_path` at the drafter made for this target."),
    "model.target-layers-out-of-range": (
        "The draft reads target layers the target does not have: it was made for another "
        "target model.",
        "Point `draft_model_path` at the drafter made for this target."),
    "model.fit": (
        "Info: target and draft agree; it names the hidden-state width the draft expects.",
        "Nothing to do."),
}

# The most common error messages: (a text the message contains, exit code, meaning, fix).
# Each text is a literal part of a message in ddtree_deploy/ (a test checks).
ERRORS: list[tuple[str, int, str, str]] = [
    ("does not exist (from", 2,
     "The hosts file that --hosts, $DDTREE_DEPLOY_HOSTS or ./hosts.yaml names is not there "
     "(the message says which one was used).",
     "Give the right path (`--hosts FILE`), or start from `examples/hosts.story.yaml`."),
    ("unknown host", 2,
     "A host name on the command line is not in the hosts file; the message lists the ones "
     "it defines and the nearest name.",
     "Use a name of `ddtree-deploy hosts list`, or add the host to hosts.yaml."),
    ("must be 1-65535", 2,
     "A hosts.yaml value is out of range; every validation error reads `FILE:LINE: FIELD: "
     "what was expected, got what`.",
     "Fix the value at that line (docs/hosts-yaml.md lists every field)."),
    ("apply would change the lab's hosts from", 2,
     "No hosts file was found, so the embedded lab file is in use, and apply refuses to "
     "change hosts it was not asked to.",
     "Name your file (`--hosts FILE`, $DDTREE_DEPLOY_HOSTS, ./hosts.yaml), or `ddtree-deploy "
     "--lab apply` to converge the lab on purpose."),
    ("is not known", 1,
     "The host's SSH key is not in known_hosts; the tool never accepts one silently.",
     "Check the fingerprint, then `ddtree-deploy hosts trust HOST`."),
    ("HOST KEY CHANGED for", 1,
     "The host offers a key other than the recorded one: a reinstall, or someone in between.",
     "If the host was reinstalled, remove the old line from known_hosts (the message names "
     "file and line), then `ddtree-deploy hosts trust HOST`."),
    ("authentication to", 1,
     "SSH reached the host but refused the user or the key.",
     "Check `user` and `identity_file` in hosts.yaml and that the public key is in the "
     "user's authorized_keys; `ssh -v` shows the same."),
    ("unreachable", 1,
     "No SSH connection within the connect timeout (no route, port closed, DNS, a jump "
     "host down). Several hosts with some unreachable: exit 3.",
     "`ddtree-deploy hosts check HOST` says which step fails; check address, port and "
     "`jump` in hosts.yaml."),
    ("sudo wants a password for this user", 1,
     "The deploy user is not root and `sudo -n` asks for a password.",
     "Allow passwordless sudo for that user (NOPASSWD in sudoers), or connect as root."),
    ("another apply holds", 1,
     "Another apply (from this or another workstation) holds the host's lock; the message "
     "names it.",
     "Wait for it to end and run again: the lock lives as long as its holder's connection, so "
     "an apply that was killed or lost its link has already let it go."),
    ("changed since the plan was made", 1,
     "`apply --plan FILE` found the hosts file or the host's facts differ from when the plan "
     "was made, so the plan may no longer be right.",
     "Make a new plan (`ddtree-deploy plan --out FILE`) and apply that."),
    ("is busy: held by", 1,
     "The GPU asked for holds another process's memory; the tool does not share it unasked.",
     "Choose a free GPU (`--gpu N`; `ddtree-deploy inventory HOST` shows them), or `--force` "
     "to share it."),
    ("is taken by", 1,
     "The port asked for is held by another process.",
     "Choose another port (`--port P`), or stop the holder."),
    ("was not created by ddtree-deploy", 1,
     "A systemd unit of that name exists and is not the tool's; it never touches others' "
     "units.",
     "Give the service another name (`--name`), or remove that unit yourself."),
    ("crash signature", 1,
     "The probe found a known crash in the server's log; the message names the signature "
     "id, explained in the section below.",
     "Follow the fix printed under it (and the section of that id here)."),
    ("no verdict within", 124,
     "The probe's deadline passed with the server neither healthy nor crashed (a long model "
     "load, JIT compiles).",
     "Probe again with a longer `--deadline` (or `--warmup` for the first tokens); "
     "`ddtree-deploy service logs HOST NAME` shows where it is."),
]

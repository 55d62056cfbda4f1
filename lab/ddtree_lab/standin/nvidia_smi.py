#!/usr/bin/python3
"""Lab stand-in for `nvidia-smi`. The lab installs it as /usr/bin/nvidia-smi in each container.

It exists because the test machine has no GPU. It prints what a real R580 nvidia-smi prints for
the queries ddtree-deploy uses. It is stdlib only, and importing it does nothing (main() runs only
when it is executed as a script).

This module is the command line (options, -L, -r, --version, -h); its parts lie beside it and the
lab installs them with it (provision.SMI_MODULES): smi_claims.py (the claim files), smi_state.py
(the spec, live claims and -i), smi_query.py (--query-* as CSV), smi_report.py (the table, -q).

Inputs:
  GPU spec JSON: $DDTREE_LAB_GPU_SPEC, default /etc/ddtree-lab/gpus.json
    {"driver_version", "cuda_version", "gpus": [{"index", "name", "uuid", "pci_bus_id",
     "memory_total_mib", "compute_cap", "power_limit_w", "dead"}]}
    Optional per-GPU keys and their defaults: persistence_mode true, ecc "N/A" (the table's
    Volatile Uncorr. ECC cell), fan_percent null (N/A), temperature_c 35, pstate "P0",
    power_draw_w 15% of the limit, utilization_gpu 0, compute_mode "Default", mig_mode null
    (N/A), memory_reserved_mib (total*615/143771, scaled from the H200 capture),
    memory_baseline_mib 9, architecture (derived from compute_cap).
  Claims: $DDTREE_LAB_GPU_CLAIMS, default /run/ddtree-lab/gpu-claims, one `<pid>.json` file each
    {"pid", "gpu_index", "used_mib", "process_name", "starttime"}. A claim counts while
    /proc/<pid> exists and, if starttime is given, field 22 of /proc/<pid>/stat still equals it
    (this catches PID reuse). Stale claim files are deleted when they are read. Claims on a dead
    GPU are ignored. write_claim() and remove_claim() manage these files for other stand-ins.

What is modelled (checked against the real H200 captures in tests/facts/nvidia_smi/):
  - `nvidia-smi` with no options: the summary table. Date line, version banner, three rows per
    GPU, and the Processes box, with the R580 column widths. Names longer than 27 characters are
    cut to 24 + "...". Process names longer than 32 keep their last 29 characters after "...".
  - `-L`, `-i/--id N|N,M|UUID|bus id` (an unknown id prints "No devices were found", exit 6).
  - `--query-gpu=F,..` and `--query-compute-apps=F,..` with `--format=csv[,noheader][,nounits]`.
    Headers use the canonical field names with units (e.g. `memory.used [MiB]`,
    `used_gpu_memory [MiB]`), and aliases map to them (gpu_name -> name). An unknown field prints
    `Field "x" is not a valid field to query.`, exit 2.
  - `-q` (a short text form) and `-q -x` (XML: a subset of the real elements, in the real order).
  - `--version`, `-h`. An unknown option prints "ERROR: Option X is not recognized. Please run
    'nvidia-smi -h' for help.", exit 2.
  - Memory: used = sum of live claims + baseline while any claim is live, else 0.
    free = total - reserved - used. (Real free can differ by 1 MiB from rounding.)
  - A dead GPU ("dead": true, like ct129's GPU1) is still listed, uses 0 MiB, and shows "ERR!" in
    the table's fan, temp, perf, power and util cells. In CSV those fields are "[Unknown Error]",
    and in the XML they are "Unknown Error". `-r/--gpu-reset` on it prints "could not be reset ...
    Not Supported", exit 3. On a GPU with live claims it prints "In use by another client", exit
    255. Otherwise it prints "... was successfully reset.".
  - A missing spec prints the real "couldn't communicate with the NVIDIA driver" text, exit 9.

Not modelled: loops (-l), -f, MIG instances, clocks, ECC counters, -d filters, and changing any
setting other than the simulated reset.
"""

import sys
from typing import Any

if __package__:  # imported as ddtree_lab.standin.*: the tool's tests, mypy
    from .smi_claims import live_claims, remove_claim, write_claim
    from .smi_query import APP_ALIASES, APP_FIELDS, GPU_ALIASES, GPU_FIELDS, query_csv
    from .smi_report import query_text, query_xml, table
    from .smi_state import SmiExit, load_state, select
else:  # run as a script, or behind the lab's launcher: this folder is on sys.path
    from smi_claims import live_claims, remove_claim, write_claim  # type: ignore[no-redef]
    from smi_query import APP_ALIASES, APP_FIELDS, GPU_ALIASES, GPU_FIELDS, query_csv  # type: ignore[no-redef]
    from smi_report import query_text, query_xml, table  # type: ignore[no-redef]
    from smi_state import SmiExit, load_state, select  # type: ignore[no-redef]

__all__ = ["live_claims", "main", "remove_claim", "run", "write_claim"]  # for the other stand-ins


def reset(gpus: list[dict[str, Any]]) -> tuple[int, str]:
    failed = [
        (g, "Not Supported" if g["dead"] else "In use by another client")
        for g in gpus
        if g["dead"] or g["procs"]
    ]
    if not failed:
        return 0, "".join(f"GPU {g['bus_id']} was successfully reset.\n" for g in gpus)
    text = "The following GPUs could not be reset:\n" + "".join(
        f"  GPU {g['bus_id']}: {why}\n" for g, why in failed
    )
    return (3 if all(g["dead"] for g, _ in failed) else 255), text


def version(state: dict[str, Any]) -> str:
    drv = state["driver"]
    return (
        f"NVIDIA-SMI version  : {drv}\nNVML version        : {'.'.join(drv.split('.')[:2])}\n"
        f"DRIVER version      : {drv}\nCUDA Version        : {state['cuda']}\n"
    )


USAGE = """NVIDIA System Management Interface -- lab stand-in (no GPU here).

nvidia-smi [OPTION1 [ARG1]] [OPTION2 [ARG2]] ...

    -h,   --help                Print usage information and exit.
          --version             Print version information and exit.
    -L,   --list-gpus           Display a list of GPUs connected to the system.
    -i,   --id=                 Target a specific GPU (index, UUID or PCI bus id; comma list).
    -q,   --query               Display GPU info.  -x, --xml-format  Produce XML output.
    --query-gpu=                Information about GPU (e.g. index,name,memory.used).
    --query-compute-apps=       Information about active compute processes.
    --format=                   csv, with optional noheader and nounits.
    -r,   --gpu-reset           Trigger a reset of one or more GPUs.
"""
VALUED = {
    "-i": "id",
    "--id": "id",
    "--query-gpu": "query_gpu",
    "--format": "format",
    "--query-compute-apps": "query_apps",
}
FLAGS = {
    "-h": "help",
    "--help": "help",
    "--version": "version",
    "-L": "list",
    "--list-gpus": "list",
    "-q": "query",
    "--query": "query",
    "-x": "xml",
    "--xml-format": "xml",
    "-r": "reset",
    "--gpu-reset": "reset",
}


def parse(argv: list[str]) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    args = iter(argv)
    for arg in args:
        key, eq, value = arg.partition("=")
        if key in VALUED:
            if not eq:
                value = next(args, None)  # type: ignore[assignment]
                if value is None:
                    raise SmiExit(
                        2,
                        f"ERROR: Option {arg} requires a value. "
                        "Please run 'nvidia-smi -h' for help.\n",
                    )
            opts[VALUED[key]] = value
        elif arg in FLAGS:
            opts[FLAGS[arg]] = True
        else:
            raise SmiExit(
                2, f"ERROR: Option {arg} is not recognized. Please run 'nvidia-smi -h' for help.\n"
            )
    return opts


def run(argv: list[str]) -> tuple[int, str]:
    """Everything main() does, minus the printing: (exit code, stdout text)."""
    opts = parse(argv)
    if opts.get("help"):
        return 0, USAGE
    state = load_state()
    if opts.get("version"):
        return 0, version(state)
    if not state["gpus"]:
        raise SmiExit(6, "No devices were found\n")
    gpus = select(state, opts.get("id"))
    if "query_gpu" in opts or "query_apps" in opts:
        fmt = {t.strip() for t in str(opts.get("format") or "").split(",") if t.strip()}
        if "csv" not in fmt:
            raise SmiExit(
                2,
                'Please specify the output format with "--format=csv". '
                "Please run 'nvidia-smi -h' for help.\n",
            )
        for token in fmt - {"csv", "noheader", "nounits"}:
            raise SmiExit(
                2,
                f"ERROR: Option {token} is not recognized. Please run 'nvidia-smi -h' for help.\n",
            )
        if "query_gpu" in opts:
            rows: list[tuple[Any, ...]] = [(state, g) for g in gpus]
            return 0, query_csv(opts["query_gpu"], fmt, rows, GPU_FIELDS, GPU_ALIASES)
        rows = [(state, g, p) for g in gpus for p in g["procs"]]
        return 0, query_csv(opts["query_apps"], fmt, rows, APP_FIELDS, APP_ALIASES)
    if opts.get("list"):
        return 0, "".join(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n" for g in gpus)
    if opts.get("reset"):
        return reset(gpus)
    if opts.get("query"):
        return 0, (query_xml if opts.get("xml") else query_text)(state, gpus)
    return 0, table(state, gpus)


def main(argv: list[str] | None = None) -> int:
    try:
        code, text = run(sys.argv[1:] if argv is None else argv)
    except SmiExit as exc:
        code, text = exc.code, exc.text
    stream = sys.stderr if text.startswith("nvidia-smi stand-in:") else sys.stdout
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:
        pass
    return code


if __name__ == "__main__":
    sys.exit(main())

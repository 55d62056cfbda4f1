"""GPU and port choice from a host's facts: pure functions (the planner, `service up`,
bench and doctor's remedies use them).

Never a dead GPU, never one whose memory another process holds, never a port something listens
on. An explicit dead or busy GPU, or a taken port, is refused unless forced, naming the PID
(and unit, port) holding it. The service's own running unit never makes its GPU or port "busy".
"""

from __future__ import annotations

from ddtree_deploy.errors import RefusedError
from ddtree_deploy.facts.model import Facts, Gpu, GpuProcess, Listener

FIRST_PORT = 30000


def _foreign(procs: list[GpuProcess], own_unit: str) -> list[GpuProcess]:
    return [p for p in procs if p.unit != own_unit]


def _who(p: GpuProcess | Listener) -> str:
    text = f"PID {p.pid}" if p.pid else "an unknown process"
    if isinstance(p, GpuProcess) and p.ports:
        text += f" (port {', '.join(str(x) for x in p.ports)})"
    if p.unit:
        text += f" of {p.unit}"
    return text


def choose_gpu(facts: Facts, wanted: int | None, *, own_unit: str, force: bool = False) -> int:
    gpus = {g.index: g for g in facts.nvidia.gpus}
    if wanted is not None:
        gpu: Gpu | None = gpus.get(wanted)
        if gpu is None:
            have = ", ".join(str(i) for i in sorted(gpus)) or "none"
            raise RefusedError(f"{facts.host} has no GPU {wanted} (GPUs: {have})")
        if gpu.dead and not force:
            raise RefusedError(f"GPU {wanted} on {facts.host} is dead: {gpu.error or 'unusable'}",
                               hint="choose another GPU with --gpu")
        busy = _foreign(gpu.processes, own_unit)
        if busy and not force:
            raise RefusedError(
                f"GPU {wanted} on {facts.host} is busy: held by "
                + "; ".join(_who(p) for p in busy),
                hint="choose a free GPU with --gpu, or --force to share it",
            )
        return wanted
    for index in sorted(gpus):
        g = gpus[index]
        if not g.dead and not _foreign(g.processes, own_unit):
            return index
    if not gpus:  # nothing to be dead or held: say what the driver said
        nv = facts.nvidia
        raise RefusedError(f"{facts.host} has no GPU: "
                           + (nv.error or "the NVIDIA driver lists none" if nv.present
                              else f"no NVIDIA driver answered ({nv.error or 'NVML, nvidia-smi'})"),
                           hint="deploy to a host with a GPU (`ddtree-deploy inventory` lists "
                                "them)")
    raise RefusedError(f"{facts.host} has no free GPU: "
                       + "; ".join(why for i in sorted(gpus)
                                   if (why := _why_not(facts, i, own_unit))))


def _why_not(facts: Facts, index: int, own_unit: str) -> str | None:
    """Why GPU ``index`` cannot serve (missing, dead, held by another process), or None."""
    gpu = {g.index: g for g in facts.nvidia.gpus}.get(index)
    if gpu is None:
        return f"GPU {index} does not exist"
    if gpu.dead:
        return f"GPU {index} is dead ({gpu.error or 'unusable'})"
    busy = _foreign(gpu.processes, own_unit)
    if busy:
        return f"GPU {index} is busy (held by " + "; ".join(_who(p) for p in busy) + ")"
    return None


def _runs(free: list[int]) -> list[list[int]]:
    """Contiguous runs of indices: [1, 2, 3, 5, 6] -> [[1, 2, 3], [5, 6]]."""
    runs: list[list[int]] = []
    for index in free:
        if runs and runs[-1][-1] == index - 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return runs


def _span(gpus: list[int]) -> str:
    return f"{gpus[0]}-{gpus[-1]}" if len(gpus) > 1 else str(gpus[0])


def choose_gpus(facts: Facts, first: int | None, tp_size: int, *, own_unit: str,
                force: bool = False) -> tuple[int, ...]:
    """The GPUs of a service with tensor parallelism ``tp_size``: contiguous indices (the
    PCI-bus order the unit's CUDA_DEVICE_ORDER uses). A given first GPU fixes them
    (first .. first+tp-1, each free unless forced); otherwise the lowest run of free GPUs
    that starts at a multiple of tp_size (GPUs 4-7 for tp 4: the half of an 8-GPU host that
    shares a PCIe switch or socket on common boards), else the lowest run anywhere."""
    if tp_size == 1:
        return (choose_gpu(facts, first, own_unit=own_unit, force=force),)
    indices = sorted(g.index for g in facts.nvidia.gpus)
    if first is not None:
        wanted = list(range(first, first + tp_size))
        missing = [i for i in wanted if i not in indices]
        if missing:
            raise RefusedError(
                f"tp {tp_size} from GPU {first} needs GPUs {_span(wanted)}; {facts.host} has "
                f"no GPU {', '.join(map(str, missing))} "
                f"(GPUs: {', '.join(map(str, indices)) or 'none'})",
                hint="choose another first GPU (hosts.yaml gpu) or a smaller tp_size")
        problems = [why for i in wanted if (why := _why_not(facts, i, own_unit))]
        if problems and not force:
            raise RefusedError(
                f"tp {tp_size} from GPU {first} needs GPUs {_span(wanted)} on {facts.host}: "
                + "; ".join(problems),
                hint="choose another first GPU (hosts.yaml gpu, --gpu) or --force to share them")
        return tuple(wanted)
    unusable = {i: why for i in indices if (why := _why_not(facts, i, own_unit))}
    runs = _runs([i for i in indices if i not in unusable])
    fits = [run[k:k + tp_size] for run in runs for k in range(len(run) - tp_size + 1)]
    aligned = [gpus for gpus in fits if gpus[0] % tp_size == 0]
    if aligned or fits:
        return tuple((aligned or fits)[0])
    longest = max(runs, key=len, default=[])
    where = (f"{facts.host} has only {len(indices)} GPU(s)" if len(indices) < tp_size
             else f"on {facts.host}")
    why = "; ".join(unusable.values())
    best = (f"the longest run of free contiguous GPUs is {_span(longest)}" if longest
            else "no GPU is free")
    raise RefusedError(
        f"tp {tp_size} needs {tp_size} free contiguous GPUs; {where}"
        + (f": {why}" if why else "") + f"; {best}",
        hint=(f"a tp_size of at most {len(longest)} fits (GPUs {_span(longest)}); or free "
              "the GPUs above" if longest and len(indices) >= tp_size
              else "deploy to a host with more GPUs, or lower tp_size"))


def choose_port(facts: Facts, wanted: int | None, *, own_unit: str, force: bool = False) -> int:
    taken = {ln.port: ln for ln in facts.services.listeners if ln.unit != own_unit}
    if wanted is not None:
        holder = taken.get(wanted)
        if holder is not None and not force:
            raise RefusedError(f"port {wanted} on {facts.host} is taken by {_who(holder)}",
                               hint="choose another port with --port")
        return wanted
    port = FIRST_PORT
    while port in taken:
        port += 1
    return port

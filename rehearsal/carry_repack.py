"""A copy of a wheel without the files a GPU host does not need, with its RECORD rewritten.

sglang-kernel 0.4.2 is 326 MB; a Hopper (SM 9.0) host loads only `sgl_kernel/sm90/` and the Python
around it. The copy keeps the name and version (sglang's engine checks sgl_kernel's version).
"""

from __future__ import annotations

import base64
import csv
import fnmatch
import hashlib
import io
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rehearsal.carry_set import CarryError, sha256_file

#: name -> (archive-path patterns to drop, why). fnmatch patterns; '*' also crosses '/'.
PROFILES: dict[str, tuple[tuple[str, ...], str]] = {
    "sm90": (
        (
            "sgl_kernel/flash_ops*.so",  # FA3, 1 GB unpacked; sgl_kernel/__init__.py never loads it
            "sgl_kernel/flashmla_ops*.so",  # FlashMLA: MLA models only
            "sgl_kernel/infllm_ops*.so",  # InfLLM-V2 (0.4.5+): infllm_v2/_loader loads it lazily
            "sgl_kernel/sm100/*",  # SM 10.x and the no-GPU fallback; SM 9.0 loads sm90/
            "deep_gemm/*",  # DeepGEMM (FP8 GEMM JIT), a package of its own
            "triton_kernels/*",  # MoE matmul_ogs kernels, a package of its own
            "_mscclpp*.so",  # mscclpp (custom all-reduce for several GPUs) ...
            "lib/*mscclpp*",
            "include/mscclpp/*",
            "include/include/nccl.h",  # ... and its NCCL shim header
        ),
        "only what SM 9.0 with the triton attention backend loads: sgl_kernel/sm90/common_ops",
    ),
    "sglang-text": (
        (
            "sglang/srt/server/_core*.so",  # the embedded Rust server: SGLANG_RUST_SERVER only
            "sglang/srt/grpc/_core*.so",  # native gRPC: --grpc-mode only (imported lazily)
            "sglang/srt/multimodal/_core*.so",  # Rust multimodal preprocessing (inkling), lazily
            "sglang/multimodal_gen/*",  # diffusion serving (sglang generate), not launch_server
            "sglang/srt/models/*.py",  # all but the kept models (OPTIONS): the registry imports
        ),                             # every module there at start and skips what is absent
        "0.5.17+: 22 MB -> 8.5 MB; its three native extensions are imported lazily behind flags; "
        "the model files the rehearsal's Qwen3 target and DFlash drafter need, and those the "
        "start-up imports (traced on the CPU with CUDA faked), are kept",
    ),
    "flashinfer-jit": (
        (
            "flashinfer/data/cutlass/examples/*",
            "flashinfer/data/cutlass/python/*",
            "flashinfer/data/cutlass/tools/*",
            "flashinfer/data/cutlass/test/*",
            "flashinfer/data/cccl/python/*",
            "flashinfer/data/cccl/benchmarks/*",
            "flashinfer/data/cccl/ci/*",
            "flashinfer/data/cccl/docs/*",
        ),
        "the JIT's headers and sources kept; the bundled projects' examples, tests and tools not",
    ),
    "xgrammar-strip": (
        ("xgrammar/lib/*.a",),  # a 65 MB static archive: for building against xgrammar only
        "0.5.17 imports xgrammar unguarded (function_call/inkling_detector.py:6); 45 MB -> 1 MB: "
        "the static archive dropped and the bindings' debug symbols stripped",
    ),
    "transformers-text": (
        ("transformers/models/*/*",),
        "transformers 5.12.1's model folders kept only where sglang 0.5.17 imports them at start "
        "(traced on the CPU with CUDA faked) and the rehearsal's qwen3: 11 MB -> 5 MB",
    ),
}

#: per profile: archive paths kept although a drop pattern matches, and shared objects whose
#: symbol tables are stripped (``strip --strip-unneeded``: the dynamic symbols stay)
_TF_KEEP = (
    "aria", "auto", "beit", "bit", "blip", "bridgetower", "chameleon", "chinese_clip", "chmv2",
    "clip", "cohere2_vision", "conditional_detr", "convnext", "deepseek_ocr2", "deepseek_v3",
    "deepseek_vl", "deepseek_vl_hybrid", "deformable_detr", "deit", "depth_pro", "detr",
    "dinov3_vit", "donut", "dpt", "efficientloftr", "efficientnet", "emu3", "encoder_decoder",
    "eomt", "ernie4_5_vl_moe", "flava", "fuyu", "gemma3", "gemma4", "gemma4_unified", "glm46v",
    "glm4v", "glm_image", "glmga", "glpn", "got_ocr2", "gpt_oss", "grounding_dino", "idefics",
    "idefics2", "idefics3", "imagegpt", "janus", "kosmos2_5", "layoutlmv2", "layoutlmv3",
    "levit", "lfm2", "lfm2_vl", "lightglue", "llama", "llama4", "llava", "llava_next",
    "llava_onevision", "mask2former", "maskformer", "mellum", "minicpmv4_6", "minimax_m3_vl",
    "mllama", "mobilenet_v1", "mobilenet_v2", "mobilevit", "nemotron_h", "nougat", "oneformer",
    "ovis2", "owlv2", "owlvit", "paddleocr_vl", "perceiver", "perception_lm",
    "phi4_multimodal", "pi0", "pix2struct", "pixtral", "poolformer", "pp_chart2table",
    "pp_doclayout_v2", "pp_doclayout_v3", "pp_formulanet", "pp_lcnet", "pp_ocrv5_server_det",
    "pp_ocrv5_server_rec", "pp_ocrv6_small_rec", "prompt_depth_anything", "pvt", "qwen2",
    "qwen2_5_vl", "qwen2_vl", "qwen3", "qwen3_moe", "rf_detr", "rt_detr", "sam", "sam2",
    "sam3", "sapiens2", "segformer", "seggpt", "siglip", "siglip2", "slanext", "smolvlm",
    "superglue", "superpoint", "swin2sr", "textnet", "timm_wrapper", "tvp", "uvdoc",
    "video_llama_3", "video_llava", "videomae", "vilt", "vit", "vitmatte", "vitpose", "vivit",
    "whisper", "yolos", "zoedepth",
)
_SGLANG_MODELS = ("__init__", "registry", "utils", "dflash", "llama", "qwen2", "qwen2_moe", "qwen3",
                  "qwen3_asr", "qwen3_moe", "qwen3_omni_moe", "qwen3_vl", "qwen3_vl_moe")
OPTIONS: dict[str, dict[str, tuple[str, ...]]] = {
    "sglang-text": {"keep": ("sglang/srt/models/*/*",  # the models' own subpackages
                             *(f"sglang/srt/models/{m}.py" for m in _SGLANG_MODELS))},
    "xgrammar-strip": {"strip": ("xgrammar/*.so",)},
    "transformers-text": {"keep": tuple(f"transformers/models/{m}/*" for m in _TF_KEEP)},
}

_SIGNATURES = ("RECORD.jws", "RECORD.p7s")


@dataclass(frozen=True)
class RepackResult:
    path: Path
    sha256: str
    size: int
    kept: int
    dropped: tuple[str, ...]


def record_hash(data_sha256: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(data_sha256).rstrip(b"=").decode()


def _dist_info(names: list[str], wheel: Path) -> str:
    dirs = {n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")
            and n.count("/") == 1 and n.endswith("/RECORD")}
    if len(dirs) != 1:
        raise CarryError(f"{wheel.name}: expected one top-level *.dist-info/RECORD, found "
                         f"{sorted(dirs) or 'none'}")
    return dirs.pop()


def _read_record(zf: zipfile.ZipFile, name: str) -> dict[str, tuple[str, str]]:
    text = zf.read(name).decode("utf-8")
    return {row[0]: (row[1], row[2]) for row in csv.reader(io.StringIO(text)) if row}


def repack_profile(src: Path, out_dir: Path, profile: str) -> RepackResult:
    """:func:`repack` with a named profile's drop, keep and strip patterns."""
    opts = OPTIONS.get(profile, {})
    return repack(src, out_dir, PROFILES[profile][0], keep=opts.get("keep", ()),
                  strip=opts.get("strip", ()))


def _stripped(data: bytes, name: str) -> bytes:
    """``data`` (a shared object) with its symbol tables stripped (binutils' strip)."""
    with tempfile.TemporaryDirectory(prefix="ddtree-strip-") as tmp:
        path = Path(tmp) / "lib.so"
        path.write_bytes(data)
        proc = subprocess.run(["strip", "--strip-unneeded", str(path)], capture_output=True,
                              text=True)
        if proc.returncode != 0:
            raise CarryError(f"strip {name} failed: {proc.stderr.strip()[-200:]}")
        return path.read_bytes()


def repack(src: Path, out_dir: Path, drop: tuple[str, ...], *, keep: tuple[str, ...] = (),
           strip: tuple[str, ...] = ()) -> RepackResult:
    """Write `out_dir/<src's file name>`: `src` less the files matching `drop` (and any RECORD
    signature), every kept file checked against the original RECORD, RECORD rewritten with each
    kept file's sha256 and size. A file matching `keep` is kept whatever `drop` says; a file
    matching `strip` (a shared object) is written with its symbol tables stripped. Entry order,
    timestamps and modes are kept, so the same input gives the same bytes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / src.name
    if out.resolve() == src.resolve():
        raise CarryError(f"{src}: the repacked copy would overwrite its source")
    try:
        zin = zipfile.ZipFile(src)
    except (OSError, zipfile.BadZipFile) as exc:
        raise CarryError(f"{src}: not a readable wheel ({exc})") from None
    with zin:
        infos = [i for i in zin.infolist() if not i.is_dir()]
        dist_info = _dist_info([i.filename for i in infos], src)
        record_name = f"{dist_info}/RECORD"
        old_record = _read_record(zin, record_name)
        protected = [i.filename for i in infos if i.filename.startswith(dist_info + "/")
                     and any(fnmatch.fnmatchcase(i.filename, p) for p in drop)]
        if protected:
            raise CarryError(f"{src.name}: a drop pattern matches the wheel's metadata "
                             f"({', '.join(protected)})")
        dropped: list[str] = []
        rows: list[tuple[str, str, str]] = []
        tmp = out.with_name(out.name + ".part")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
            for info in infos:
                name = info.filename
                if name == record_name:
                    continue
                if name.rsplit("/", 1)[-1] in _SIGNATURES and name.startswith(dist_info + "/"):
                    dropped.append(name)
                    continue
                if any(fnmatch.fnmatchcase(name, p) for p in drop) and not any(
                        fnmatch.fnmatchcase(name, p) for p in keep):
                    dropped.append(name)
                    continue
                if any(fnmatch.fnmatchcase(name, p) for p in strip):
                    original = zin.read(info)
                    h = record_hash(hashlib.sha256(original).digest())
                    listed = old_record.get(name)
                    if listed and listed[0] and listed[0] != h:
                        tmp.unlink()
                        raise CarryError(f"{src.name}: {name} does not match the wheel's own "
                                         "RECORD (a damaged download?)")
                    data = _stripped(original, name)
                    zout.writestr(_copy_info(info), data)
                    rows.append((name, record_hash(hashlib.sha256(data).digest()),
                                 str(len(data))))
                    continue
                digest = hashlib.sha256()
                size = 0
                with zin.open(info) as fin, zout.open(_copy_info(info), "w",
                                                      force_zip64=info.file_size > 2**31) as fo:
                    while chunk := fin.read(1 << 20):
                        digest.update(chunk)
                        size += len(chunk)
                        fo.write(chunk)
                h = record_hash(digest.digest())
                listed = old_record.get(name)
                if listed and listed[0] and listed[0] != h:
                    tmp.unlink()
                    raise CarryError(f"{src.name}: {name} does not match the wheel's own RECORD "
                                     "(a damaged download?)")
                rows.append((name, h, str(size)))
            buf = io.StringIO()
            writer = csv.writer(buf, lineterminator="\n")
            writer.writerows(rows)
            writer.writerow((record_name, "", ""))
            record_info = _copy_info(zin.getinfo(record_name))
            zout.writestr(record_info, buf.getvalue().encode("utf-8"))
    tmp.replace(out)
    return RepackResult(path=out, sha256=sha256_file(out), size=out.stat().st_size,
                        kept=len(rows), dropped=tuple(dropped))


def _copy_info(info: zipfile.ZipInfo) -> zipfile.ZipInfo:
    new = zipfile.ZipInfo(info.filename, date_time=info.date_time)
    new.external_attr = info.external_attr
    new.create_system = info.create_system
    new.compress_type = zipfile.ZIP_DEFLATED
    return new


def record_problems(wheel: Path) -> list[str]:
    """What is wrong with `wheel`'s RECORD: files missing from it, listed files that are absent, and
    wrong hashes or sizes. Empty when every file is listed right."""
    with zipfile.ZipFile(wheel) as zf:
        infos = [i for i in zf.infolist() if not i.is_dir()]
        record_name = f"{_dist_info([i.filename for i in infos], wheel)}/RECORD"
        record = _read_record(zf, record_name)
        problems: list[str] = []
        present = set()
        for info in infos:
            name = info.filename
            present.add(name)
            if name == record_name:
                continue
            if name not in record:
                problems.append(f"{name}: not in RECORD")
                continue
            h, size = record[name]
            data = zf.read(info)
            if h != record_hash(hashlib.sha256(data).digest()):
                problems.append(f"{name}: RECORD hash {h} is wrong")
            if size != str(len(data)):
                problems.append(f"{name}: RECORD size {size}, the file has {len(data)} bytes")
        problems += [f"{n}: in RECORD, not in the wheel" for n in record if n not in present]
    return problems

"""systemd units: rendering (exact lines, quoting, LD_LIBRARY_PATH) and real verification.

The verify tests run this machine's own `systemd-analyze verify` through LocalTransport,
against a venv-like folder whose bin/python is a symlink to the system python.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from ddtree_deploy.errors import DeployError, ExitCode
from ddtree_deploy.facts.model import Facts, NvidiaLayout, Venv
from ddtree_deploy.remote.facts_venv import nvidia_layout
from ddtree_deploy.service.render import (
    UnitRenderError,
    WrapperSpec,
    ld_library_path,
    render_unit,
    render_wrapper,
    systemd_env,
    systemd_quote,
    systemd_quote_executable,
)
from ddtree_deploy.service.spec import ServiceSpec
from ddtree_deploy.service.verify import UnitVerifyError, verify_unit
from ddtree_deploy.settings.model import DdtreeSettings, ServerSettings
from ddtree_deploy.transport.local import LocalTransport

H200 = Path(__file__).parent / "facts" / "inventory" / "h200-cu130.json"
STORY_VENV = "/root/venv_sglang211"
STORY_SP = f"{STORY_VENV}/lib/python3.12/site-packages"
needs_analyzer = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here"
)


def h200_venv() -> Venv:
    data = json.loads(H200.read_text())
    (host,) = data["output"]
    venv = Facts.model_validate(host).venv("/opt/torch/.venv")
    assert venv is not None
    return venv


def story_lib_dirs() -> tuple[str, ...]:
    """The H200 host's real cu130 nvidia folders, as they sit in the story's venv."""
    real = h200_venv()
    assert real.site_packages is not None
    layout = real.nvidia.model_copy(
        update={"lib_dirs": [d.replace(real.site_packages, STORY_SP) for d in real.nvidia.lib_dirs]}
    )
    return ld_library_path(real.model_copy(update={"path": STORY_VENV, "nvidia": layout}))


_SETTINGS = {"model_path", "draft_model_path", "algorithm", "attention_backend",
             "grammar_backend", "sampling_backend", "mem_fraction_static", "context_length",
             "tp_size", "cuda_graph", "extra_args", "environment"}
_TREE = {"ddtree_budget": "budget", "ddtree_topk": "topk", "ddtree_shadow_linear": "shadow_linear"}


def story_spec(**changes: object) -> ServiceSpec:
    """The story's service; `changes` to it or to its settings (not validated: render's own
    refusals are under test here, the settings' are in test_settings.py)."""
    settings: dict[str, object] = {
        "model_path": "/models/Qwen3-8B", "draft_model_path": "/models/Qwen3-8B-DFlash-b16",
        "algorithm": "ddtree", "attention_backend": "triton", "grammar_backend": "none",
        "mem_fraction_static": 0.8}
    tree: dict[str, object] = {"budget": 15, "topk": 8}
    rest: dict[str, object] = {}
    for key, value in changes.items():
        if key in _TREE:
            tree[_TREE[key]] = value
        elif key in _SETTINGS:
            settings[key] = list(value) if key == "extra_args" else value  # type: ignore[call-overload]
        else:
            rest[key] = value
    ddtree = DdtreeSettings.model_construct(**tree) if settings["algorithm"] == "ddtree" else None
    spec = ServiceSpec(
        name="sglang-ddtree",
        host="ct200",
        venv=STORY_VENV,
        gpus=(1,),
        port=30001,
        deployment="ct200-ddtree",
        settings=ServerSettings.model_construct(ddtree=ddtree, **settings),  # type: ignore[arg-type]
        num_draft_tokens=16,
        ld_library_path=story_lib_dirs(),
    )
    return replace(spec, **rest)  # type: ignore[arg-type]


def lines(text: str) -> list[str]:
    return text.splitlines()


def exec_start(text: str) -> list[str]:
    out = lines(text)
    first = next(i for i, line in enumerate(out) if line.startswith("ExecStart="))
    block = [out[first]]
    while block[-1].endswith(" \\"):
        block.append(out[first + len(block)])
    return block


# -- rendering the story's deployment ----------------------------------------------------


def test_story_ddtree_unit_exact_lines() -> None:
    unit = render_unit(story_spec(), tool_version="0.1.0")
    got = lines(unit)
    assert got[0] == (
        "# Rendered by ddtree-deploy 0.1.0 for deployment ct200-ddtree on ct200; "
        "do not edit: re-render with ddtree-deploy service up"
    )
    sp = STORY_SP + "/nvidia"
    expected_in_order = [
        "[Unit]",
        "Description=SGLang ddtree server sglang-ddtree on port 30001",
        "After=network-online.target",
        "Wants=network-online.target",
        "StartLimitIntervalSec=300",
        "StartLimitBurst=3",
        "X-DDTreeDeploy-Managed=yes",
        "X-DDTreeDeploy-Deployment=ct200-ddtree",
        "X-DDTreeDeploy-Port=30001",
        "[Service]",
        "Type=simple",
        "WorkingDirectory=/root/venv_sglang211",
        "Environment=CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "Environment=CUDA_VISIBLE_DEVICES=1",
        f"Environment=LD_LIBRARY_PATH={sp}/cu13/lib:{sp}/cudnn/lib:{sp}/nccl/lib:"
        f"{sp}/nvshmem/lib:{sp}/cusparselt/lib",
        "Environment=PYTHONUNBUFFERED=1",
        "Restart=on-failure",
        "RestartSec=5",
        "TimeoutStopSec=30",
        "KillMode=mixed",
        "SyslogIdentifier=sglang-ddtree",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    positions = [got.index(line) for line in expected_in_order]
    assert positions == sorted(positions)
    assert exec_start(unit) == [
        "ExecStart=/root/venv_sglang211/bin/python -m sglang.launch_server \\",
        "    --model-path /models/Qwen3-8B \\",
        "    --host 0.0.0.0 \\",
        "    --port 30001 \\",
        "    --speculative-algorithm DDTREE \\",
        "    --speculative-draft-model-path /models/Qwen3-8B-DFlash-b16 \\",
        "    --speculative-num-draft-tokens 16 \\",
        "    --speculative-ddtree-budget 15 \\",
        "    --speculative-ddtree-topk 8 \\",
        "    --attention-backend triton \\",
        "    --grammar-backend none \\",
        "    --mem-fraction-static 0.8",
    ]
    # every directive line is one of the above or a comment: nothing else slipped in
    directives = [ln for ln in got if ln and not ln.startswith(("#", " "))]
    assert len(directives) == len(expected_in_order) + 1  # + ExecStart
    assert "KillMode=mixed" in unit and "# KillMode=mixed:" in unit  # the reason is written


def test_shadow_linear_and_no_cuda_graph_and_extra_args() -> None:
    unit = render_unit(
        story_spec(ddtree_shadow_linear=True, cuda_graph=False, extra_args=("--page-size", "1")),
        tool_version="0.1.0",
    )
    block = exec_start(unit)
    assert "    --speculative-ddtree-shadow-linear \\" in block
    assert "    --disable-cuda-graph \\" in block
    assert block[-1] == "    --page-size 1"


def test_dflash_variant_has_no_ddtree_flags() -> None:
    unit = render_unit(
        story_spec(algorithm="dflash", name="sglang-dflash", deployment=None), tool_version="0.2.0"
    )
    block = "\n".join(exec_start(unit))
    assert "--speculative-algorithm DFLASH" in block
    assert "--speculative-draft-model-path /models/Qwen3-8B-DFlash-b16" in block
    assert "ddtree" not in block
    assert lines(unit)[0].startswith("# Rendered by ddtree-deploy 0.2.0 for service sglang-dflash ")
    assert "X-DDTreeDeploy-Deployment" not in unit  # no deployment: no key
    assert "SyslogIdentifier=sglang-dflash" in lines(unit)


def test_none_variant_is_a_plain_server_on_two_gpus() -> None:
    spec = story_spec(
        algorithm="none",
        draft_model_path=None,
        gpus=(2, 3),
        tp_size=2,
        attention_backend=None,
        grammar_backend=None,
        mem_fraction_static=None,
    )
    unit = render_unit(spec, tool_version="0.1.0")
    assert "Environment=CUDA_VISIBLE_DEVICES=2,3" in lines(unit)
    assert exec_start(unit) == [
        "ExecStart=/root/venv_sglang211/bin/python -m sglang.launch_server \\",
        "    --model-path /models/Qwen3-8B \\",
        "    --host 0.0.0.0 \\",
        "    --port 30001 \\",
        "    --tp-size 2",
    ]
    assert "Description=SGLang none server sglang-ddtree on port 30001" in lines(unit)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"gpus": ()}, "no GPU chosen"),
        ({"gpus": (1,), "tp_size": 2}, "tp size 2 needs 2 GPU(s)"),
        ({"gpus": (1, 1), "tp_size": 2}, "listed twice"),
        ({"gpus": (-1,)}, "non-negative"),
        ({"port": 70000}, "not in 1..65535"),
        ({"draft_model_path": None}, "needs a draft model path"),
        ({"name": "bad/name"}, "unit name"),
        ({"name": "a\\x2d"}, "unit name"),
        ({"deployment": "x\n[Service]\nExecStartPre=/bin/rm"}, "control character"),
        ({"host": "ct200\nUser=nobody"}, "control character"),
        ({"venv": "relative/venv"}, "absolute path"),
        ({"venv": '/root/ve"nv'}, "systemd refuses"),
        ({"model_path": "/models/a\nb"}, "control character"),
        ({"extra_args": ("--api-key", "sk-123")}, "secret"),
        ({"ld_library_path": ("/a/nvidia/cu13/lib", "lib:relative")}, "without ':'"),
    ],
)
def test_bad_values_are_refused_clearly(changes: dict[str, object], needle: str) -> None:
    with pytest.raises(UnitRenderError) as err:
        render_unit(story_spec(**changes), tool_version="0.1.0")
    assert needle in str(err.value)
    assert isinstance(err.value, DeployError) and err.value.exit_code == ExitCode.USAGE


# -- quoting -------------------------------------------------------------------------------

_C_ESCAPES = {"\\": "\\", '"': '"', "'": "'", "n": "\n", "t": "\t"}


def unquote_word(word: str, *, dollar: bool) -> str:
    """Undo one word the way systemd reads it: quotes and C escapes, then %% and $$."""
    out, i, quoted = [], 0, False
    while i < len(word):
        ch = word[i]
        if ch == '"':
            quoted = not quoted
        elif ch == "\\":
            out.append(_C_ESCAPES[word[i + 1]])
            i += 1
        else:
            assert quoted or not ch.isspace(), f"unquoted space in {word!r}"
            out.append(ch)
        i += 1
    assert not quoted
    text = "".join(out)
    text = text.replace("%%", "\0")
    assert "%" not in text, f"a bare % would be a specifier: {word!r}"
    text = text.replace("\0", "%")
    if dollar:
        text = text.replace("$$", "\0")
        assert "$" not in text, f"a bare $ would expand a variable: {word!r}"
        text = text.replace("\0", "$")
    return text


HOSTILE = [
    "plain",
    "with space",
    'double"quote',
    "single'quote",
    "$HOME",
    "${HOME}",
    "%h",
    "100%",
    ";",
    "a;b",
    "back\\slash",
    "trailing\\",
    "--flag=va lue",
    "ünïcödé",
]


@pytest.mark.parametrize("value", HOSTILE)
def test_systemd_quote_round_trips(value: str) -> None:
    quoted = systemd_quote(value)
    assert unquote_word(quoted, dollar=True) == value


def test_systemd_quote_exact_forms() -> None:
    assert systemd_quote("/models/Qwen3-8B") == "/models/Qwen3-8B"
    assert systemd_quote("a b") == '"a b"'
    assert systemd_quote("$HOME") == '"$$HOME"'
    assert systemd_quote("%h") == "%%h"
    assert systemd_quote(";") == '";"'
    assert systemd_quote('say "hi"\\') == '"say \\"hi\\"\\\\"'
    with pytest.raises(UnitRenderError, match="an empty argument"):  # refused since issue 29
        systemd_quote("")
    assert systemd_quote_executable("/opt/my venv/bin/python") == '"/opt/my venv/bin/python"'
    with pytest.raises(UnitRenderError, match=r"contains \$"):  # systemd expands argv[0]
        systemd_quote_executable("/opt/$x/python")
    assert systemd_env("A", "$HOME 100%") == '"A=$HOME 100%%"'  # $ means nothing in Environment=


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "tab\there", "nul\0", "esc\x1b[0m"])
def test_control_characters_are_rejected(bad: str) -> None:
    for quote in (systemd_quote, systemd_quote_executable):
        with pytest.raises(UnitRenderError, match="control character"):
            quote("/x" + bad)
    with pytest.raises(UnitRenderError, match="control character"):
        systemd_env("X", bad)


def test_environment_names_and_secrets() -> None:
    with pytest.raises(UnitRenderError, match="invalid environment variable name"):
        systemd_env("1BAD", "x")
    for name in ("HF_TOKEN", "OPENAI_API_KEY", "DB_PASSWORD", "MY_SECRET"):
        with pytest.raises(UnitRenderError, match="looks like a secret") as err:
            systemd_env(name, "x")
        assert err.value.hint is not None and "EnvironmentFile" in err.value.hint


# -- LD_LIBRARY_PATH -------------------------------------------------------------------------


def test_ld_library_path_cu13_from_the_real_h200_venv() -> None:
    venv = h200_venv()
    base = "/opt/torch/.venv/lib/python3.12/site-packages/nvidia"
    # the probe lists them by name; the loader wants the toolkit first
    assert venv.nvidia.lib_dirs[2] == f"{base}/cusparselt/lib"
    assert ld_library_path(venv) == tuple(
        f"{base}/{c}/lib" for c in ("cu13", "cudnn", "nccl", "nvshmem", "cusparselt")
    )


def test_ld_library_path_cu12_per_component_layout(tmp_path: Path) -> None:
    sp = tmp_path / "site-packages"
    files = {
        "cublas": "libcublas.so.12", "cuda_nvrtc": "libnvrtc.so.12",
        "cuda_runtime": "libcudart.so.12", "cusparse": "libcusparse.so.12",
        "cudnn": "libcudnn.so.9", "nccl": "libnccl.so.2", "nvshmem": "libnvshmem_host.so.3",
        "cusparselt": "libcusparseLt.so.0", "zzextra": "libz.so.1",
    }  # fmt: skip
    for comp, lib in files.items():
        (sp / "nvidia" / comp / "lib").mkdir(parents=True)
        (sp / "nvidia" / comp / "lib" / lib).write_bytes(b"")
    layout = NvidiaLayout.model_validate(nvidia_layout(str(sp)))  # the probe's own reading
    dirs = ld_library_path(Venv(path=str(tmp_path), nvidia=layout))
    comps = [Path(d).parent.name for d in dirs]
    assert comps == ["cuda_runtime", "cuda_nvrtc", "cublas", "cusparse",
                     "cudnn", "nccl", "nvshmem", "cusparselt", "zzextra"]  # fmt: skip
    assert all(d.startswith(str(sp)) and d.endswith("/lib") for d in dirs)


def test_ld_library_path_empty_layout_gives_no_line() -> None:
    assert ld_library_path(Venv(path="/v")) == ()
    unit = render_unit(story_spec(ld_library_path=()), tool_version="0.1.0")
    assert "LD_LIBRARY_PATH" not in unit


# -- the wrapper unit -------------------------------------------------------------------------


def test_wrapper_unit_for_the_gpu0_wrapper() -> None:
    spec = WrapperSpec(
        name="gpu0-wrapper",
        command=("/root/bin/serve-gpu0.sh", "--port", "30000", "--model", "/models/a b"),
        gpus=(0,),
        port=30000,
        env={"MODEL_NAME": "qwen 8b"},
        host="ct200",
    )
    unit = render_wrapper(spec, "0.1.0")
    got = lines(unit)
    assert got[0].startswith("# Rendered by ddtree-deploy 0.1.0 for wrapper gpu0-wrapper on ct200")
    for line in (
        "Description=ddtree-deploy wrapper gpu0-wrapper on GPU 0, port 30000",
        "StartLimitIntervalSec=300",
        "StartLimitBurst=3",
        "X-DDTreeDeploy-Managed=yes",
        "X-DDTreeDeploy-Port=30000",
        "Environment=CUDA_VISIBLE_DEVICES=0",
        'Environment="MODEL_NAME=qwen 8b"',
        "Restart=on-failure",
        "KillMode=mixed",
        "TimeoutStopSec=30",
        "WorkingDirectory=/",
    ):
        assert line in got
    assert exec_start(unit) == [
        "ExecStart=/root/bin/serve-gpu0.sh \\",
        "    --port 30000 \\",
        '    --model "/models/a b"',
    ]
    with pytest.raises(UnitRenderError, match="set by the tool"):
        render_wrapper(replace(spec, env={"CUDA_VISIBLE_DEVICES": "0,1"}), "0.1.0")
    with pytest.raises(UnitRenderError, match="empty"):
        render_wrapper(replace(spec, command=()), "0.1.0")
    with pytest.raises(UnitRenderError, match="absolute"):
        render_wrapper(replace(spec, command=("serve.sh",)), "0.1.0")


# -- real systemd-analyze verify -------------------------------------------------------------


@pytest.fixture()
def fake_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv 50%"  # a space and a % in the real path: quoting must hold
    (venv / "bin").mkdir(parents=True)
    os.symlink("/usr/bin/python3", venv / "bin" / "python")
    return venv


@pytest.fixture()
def verify_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "verify-tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))  # where verify's mktemp -d goes
    return folder


@needs_analyzer
def test_verify_accepts_a_good_unit_silently(fake_venv: Path, verify_tmp: Path) -> None:
    hostile = ("--x", "$HOME", "%h", ";", 'q"uote', "back\\slash", "a b")
    spec = story_spec(venv=str(fake_venv), extra_args=hostile)
    unit = render_unit(spec, tool_version="0.1.0")
    verify_unit(LocalTransport(), unit, spec.unit_name)  # X- keys, escapes: all silent
    wrapper = render_wrapper(
        WrapperSpec(
            name="w",
            command=(str(fake_venv / "bin" / "python"), "-c", "pass"),
            gpus=(0,),
            port=30000,
            env={"A": "$x %y"},
        ),
        "0.1.0",
    )
    verify_unit(LocalTransport(), wrapper, "w.service")
    assert list(verify_tmp.iterdir()) == []  # the temporary folder was removed


@needs_analyzer
def test_verify_fails_when_the_execstart_binary_is_missing(
    fake_venv: Path, verify_tmp: Path
) -> None:
    missing = fake_venv.parent / "no such venv %d"
    spec = story_spec(venv=str(missing))
    with pytest.raises(UnitVerifyError) as err:
        verify_unit(LocalTransport(), render_unit(spec, tool_version="0.1.0"), spec.unit_name)
    # the analyzer names the path it parsed: quoting gave back the exact real path
    assert f"Command {missing}/bin/python is not executable" in str(err.value)
    assert "sglang-ddtree.service" in err.value.output
    assert err.value.exit_code == ExitCode.FAILED
    assert list(verify_tmp.iterdir()) == []


@needs_analyzer
def test_verify_fails_on_a_bad_directive(fake_venv: Path, verify_tmp: Path) -> None:
    unit = render_unit(story_spec(venv=str(fake_venv)), tool_version="0.1.0")
    bad = unit.replace("KillMode=mixed\n", "KillMode=mixed\nRestartForever=yes\n")
    with pytest.raises(UnitVerifyError) as err:
        verify_unit(LocalTransport(), bad, "sglang-ddtree.service")
    assert "Unknown key" in str(err.value) and "RestartForever" in str(err.value)
    # a raw % (a specifier systemd cannot resolve) is caught too: what our quoting prevents
    raw = unit.replace("--model-path /models/Qwen3-8B", "--model-path /models/%Z")
    with pytest.raises(UnitVerifyError, match="specifier"):
        verify_unit(LocalTransport(), raw, "sglang-ddtree.service")
    assert list(verify_tmp.iterdir()) == []


def test_verify_refuses_a_bad_unit_name() -> None:
    with pytest.raises(UnitVerifyError, match="not a unit file name"):
        verify_unit(LocalTransport(), "[Unit]\n", "../etc/passwd")

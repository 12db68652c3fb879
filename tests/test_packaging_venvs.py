"""The built wheel in fresh virtual environments keeps each install's promise (README, Install).

Three venvs, made concurrently from one wheel (`pip wheel --no-deps .`) by the README's own
install lines, with nothing from this checkout on their path and every command run from a
directory outside it:

* base (`pip install sglang-ds41`): no torch, numba or sglang; `render` / `parse` / the
  `--scripted` agent examples as the README shows them; `sglang-ds41 agent` against a scripted
  server; `inspect`; `serve` and `make-tiny` refuse at once with the exact pip command.
* beside the newest `openai-agents` and `pydantic-ai` (no version asked for): pip installs the
  same releases it picks for them alone, `pip check` is clean, `import agents` is theirs, and
  our runner (under openai 3.x) runs the agent, plain and streamed.
* the serve extra (`pip install 'sglang-ds41[model]'`, then the README's CPU serving line):
  `make-tiny` works after the first, and after the second `serve --tiny` serves: the README's
  tiny-model commands pass as written (token for token against the reference, in the default
  float32 of both), with a two-line start log, `/v1/models` naming DeepSeek-V4.1-Flash and
  cached-token counts in the usage; every installed sglang requirement is at a version sglang
  accepts. This one is heavy: a 6 GB venv (torch and its CUDA libraries come from this machine's
  wheel mirror or pip's cache, nothing is downloaded twice), ~1.5 min to install and ~3.5 min to
  build the tiny model, serve it and run the README commands on the shared 2-core box. That
  would take CI past its budget, so it runs with `scripts/test.sh --slow` (marked slow); the
  base and beside venvs (~25 s to install, concurrently) run in every CI run.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.examples.commands import REPO, Session, bash_blocks, readme_examples, segments
from tests.examples.test_commands import check
from tests.integration.server import free_port

PIP = ["-m", "pip", "--disable-pip-version-check", "--no-input"]
README_INSTALL = next(
    b for b in bash_blocks((REPO / "README.md").read_text()) if b[0] == "pip install sglang-ds41"
)
ANSWER = "Paris 18.5 °C, Oslo 4.0 °C; the average is 11.25 °C."
TIMES: dict[str, float] = {}


def sh(argv, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, f"{argv}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def install_lines(wheel: Path) -> dict[str, list[list[str]]]:
    """The README's install lines as pip argument lists, the wheel in place of the project name."""
    out = {}
    for line in README_INSTALL:
        steps = []
        for part in line.split("&&"):
            words = part.split()
            assert words[:2] == ["pip", "install"], line
            args = [w.strip("'") for w in words[2:]]
            args = [str(wheel) + a[len("sglang-ds41") :] if a.startswith("sglang-ds41") else a for a in args]
            steps.append(args)
        key = re.search(r"sglang-ds41(\[\w+\])?", line).group(1) or "[base]"
        out[key.strip("[]")] = steps
    assert sorted(out) == ["base", "model", "serve"], out
    return out


class Venv:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin"
        self.python = str(self.bin / "python")

    def create(self) -> Venv:
        sh(["python3.11", "-m", "venv", str(self.root)])
        return self

    def pip(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        return sh([self.python, *PIP, *args], cwd=self.root, **kwargs)

    def install(self, args: list[str]) -> None:
        self.pip("install", "--quiet", "--no-compile", *args)

    def version(self, name: str) -> str | None:
        probe = (
            f"from importlib.metadata import version\ntry: print(version({name!r}))\nexcept Exception: pass"
        )
        return sh([self.python, "-c", probe], cwd=self.root).stdout.strip() or None

    def run(self, *argv: str, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(self.bin / argv[0]), *argv[1:]], cwd=cwd, capture_output=True, text=True, **kwargs
        )


def timed(name: str, fn):
    t0 = time.monotonic()
    result = fn()
    TIMES[name] = time.monotonic() - t0
    return result


@pytest.fixture(scope="module", autouse=True)
def _report_times(request):
    """How long the venvs took, in the terminal summary (CI's budget: see the module docstring)."""
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and TIMES:
        reporter.write_line("packaging venvs: " + ", ".join(f"{k} {v:.0f} s" for k, v in TIMES.items()))


def source_tree(dest: Path) -> Path:
    """The checkout's files as git sees them (tracked, and new ones not ignored), copied to `dest`:
    setuptools reuses an in-tree `build/`, so a wheel built in place could carry modules that
    were moved or deleted since the last build."""
    listed = sh(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"])
    for name in filter(None, listed.stdout.split("\0")):
        source = REPO / name
        if source.is_file():  # a deleted file not yet committed is still listed
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    source = source_tree(tmp_path_factory.mktemp("source"))
    sh(
        [
            sys.executable,
            *PIP,
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(source),
        ]
    )
    [built] = out.glob("sglang_ds41-*.whl")
    return built


@pytest.fixture(scope="module")
def cwd(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("elsewhere")  # not the checkout: nothing importable from here


@pytest.fixture(scope="module")
def light_venvs(wheel, tmp_path_factory) -> dict[str, Venv]:
    """base and coexistence venvs, installed concurrently."""
    root = tmp_path_factory.mktemp("venvs")
    lines = install_lines(wheel)

    def base() -> Venv:
        venv = Venv(root / "base").create()
        for args in lines["base"]:
            venv.install(args)
        return venv

    def beside() -> Venv:
        venv = Venv(root / "beside").create()
        venv.install([*lines["base"][0], "openai-agents", "pydantic-ai"])
        return venv

    with ThreadPoolExecutor(2) as pool:
        jobs = {
            "base": pool.submit(timed, "base venv", base),
            "beside": pool.submit(timed, "beside venv", beside),
        }
        return {name: job.result() for name, job in jobs.items()}


# ---- base ------------------------------------------------------------------------------------


def test_base_install_has_no_torch_numba_or_sglang(light_venvs):
    base = light_venvs["base"]
    for heavy in ("torch", "numba", "sglang", "triton", "transformers"):
        assert base.version(heavy) is None, f"the base install pulled in {heavy}"
    assert base.version("sglang-ds41") == "0.1.0"


def test_base_install_runs_the_readme_examples_that_need_no_server(light_venvs, cwd, tmp_path):
    session = Session(bin_dir=light_venvs["base"].bin, cwd=cwd, scratch=tmp_path, port=9)
    for server, commands in segments(readme_examples()):
        if server is None:
            for command in commands:
                check(session.run(command), session)
    assert len(session.results) == 5


def test_base_install_renders_the_same_ids_as_the_oracle_tested_environment(light_venvs, cwd):
    example = str(REPO / "examples" / "example_harmony.json")
    ours = sh([sys.executable, "-m", "sglang_ds41", "render", example, "--tokens"]).stdout
    fresh = light_venvs["base"].run("sglang-ds41", "render", example, "--tokens", cwd=cwd)
    assert fresh.returncode == 0 and json.loads(fresh.stdout) == json.loads(ours)


def scripted_agent_run(venv: Venv, cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    from tests.examples.commands import load_example

    spec = str(REPO / "examples" / "agents" / "weather.yaml")
    with load_example("weather_calculator").scripted() as server:
        return venv.run(
            "sglang-ds41", "agent", spec, "--base-url", server.base_url, *extra, cwd=cwd, timeout=300
        )


@pytest.mark.parametrize("venv", ["base", "beside"])
@pytest.mark.parametrize("stream", [False, True])
def test_the_agent_cli_runs_against_a_scripted_server(light_venvs, cwd, venv, stream):
    run = scripted_agent_run(light_venvs[venv], cwd, *(["--stream"] if stream else []))
    assert run.returncode == 0, run.stderr
    assert run.stdout == ANSWER + "\n" and "[done] 3 steps, 3 tool calls" in run.stderr
    assert ("[thinking] Look up both cities." in run.stderr) is stream


def test_base_install_inspects_but_refuses_to_serve_with_the_exact_command(light_venvs, cwd, wheel):
    from sglang_ds41.cache import tiny_checkpoint

    base = light_venvs["base"]
    inspected = base.run("sglang-ds41", "inspect", str(tiny_checkpoint()), cwd=cwd)
    assert inspected.returncode == 0 and ": OK" in inspected.stdout
    t0 = time.monotonic()
    served = base.run("sglang-ds41", "serve", "--tiny", cwd=cwd)
    assert time.monotonic() - t0 < 10 and served.returncode == 2 and "Traceback" not in served.stderr
    pip = re.escape(str(base.bin)) + r"/python(3\.11)? -m pip install"
    assert re.search(
        rf"{pip} '{re.escape(str(wheel))}\[serve\]' && {pip} --no-deps sglang==0\.5\.23", served.stderr
    )
    tiny = base.run("sglang-ds41", "make-tiny", str(cwd / "t"), cwd=cwd)
    assert tiny.returncode == 2 and "Traceback" not in tiny.stderr
    assert re.search(rf"needs torch, .* {pip} '{re.escape(str(wheel))}\[model\]'", tiny.stderr), tiny.stderr
    version = base.run("sglang-ds41", "--version", cwd=cwd)
    assert version.stdout == "sglang-ds41 0.1.0 (sglang not installed, torch not installed)\n"


# ---- beside openai-agents and pydantic-ai -----------------------------------------------------


def test_the_newest_openai_agents_and_pydantic_ai_install_beside_us(light_venvs, tmp_path):
    beside = light_venvs["beside"]
    report = tmp_path / "alone.json"
    beside.pip(
        "install",
        "--quiet",
        "--dry-run",
        "--ignore-installed",
        "--report",
        str(report),
        "openai-agents",
        "pydantic-ai",
    )
    alone = {
        i["metadata"]["name"].lower(): i["metadata"]["version"]
        for i in json.loads(report.read_text())["install"]
    }
    for name in ("openai-agents", "pydantic-ai", "openai"):
        assert beside.version(name) == alone[name], (
            f"{name}: {beside.version(name)} beside us, {alone[name]} alone"
        )
    assert beside.pip("check").returncode == 0
    assert int(beside.version("openai").split(".")[0]) >= 3  # what they need; our runner too


def test_their_import_names_and_ours_coexist(light_venvs, cwd):
    probe = (
        "import agents, pydantic_ai, sglang_ds41.agents, sglang_ds41.encoding\n"
        "assert hasattr(agents, 'Runner') and hasattr(agents, 'Agent'), agents.__file__\n"
        "assert 'site-packages/agents/' in agents.__file__\n"
        "from pydantic_ai import Agent\n"
        "print(sglang_ds41.agents.Runner.__module__)"
    )
    run = light_venvs["beside"].run("python", "-c", probe, cwd=cwd)
    assert run.returncode == 0 and run.stdout.strip() == "sglang_ds41.agents.runner", run.stderr


# ---- the serve extra -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def serve_venv(wheel, tmp_path_factory, cwd):
    root = tmp_path_factory.mktemp("serve-venv")
    lines = install_lines(wheel)
    venv = Venv(root / "venv").create()
    cache = root / "cache"
    (model_args,) = lines["model"]
    timed("serve venv: model extra", lambda: venv.install(model_args))
    tiny = venv.run("sglang-ds41", "make-tiny", str(root / "made"), cwd=cwd, timeout=600)
    assert tiny.returncode == 0, tiny.stderr
    for i, args in enumerate(lines["serve"]):
        timed(f"serve venv: serve line, step {i + 1}", lambda args=args: venv.install(args))
    venv.cache = cache
    yield venv
    shutil.rmtree(root, ignore_errors=True)  # ~6 GB


@pytest.mark.slow
@pytest.mark.integration
def test_the_serve_extra_serves_the_tiny_model_as_the_readme_shows(serve_venv, cwd, tmp_path):
    version = serve_venv.run("sglang-ds41", "--version", cwd=cwd)
    assert version.stdout.startswith("sglang-ds41 0.1.0 (sglang 0.5.23, torch 2.14.1")
    [(server, commands)] = [s for s in segments(readme_examples()) if s[0] and "--tiny" in s[0]]
    session = Session(
        bin_dir=serve_venv.bin,
        cwd=cwd,
        scratch=tmp_path,
        port=free_port(),
        env={"SGLANG_DS41_CACHE": str(serve_venv.cache)},
    )
    TIMES["serve --tiny: ready"] = session.start(server)
    try:
        url = f"http://127.0.0.1:{session.port}/v1"
        with urllib.request.urlopen(f"{url}/models", timeout=60) as reply:
            assert [m["id"] for m in json.loads(reply.read())["data"]] == ["DeepSeek-V4.1-Flash"]
        cached = [chat(url)["usage"]["prompt_tokens_details"]["cached_tokens"] for _ in range(2)]
        assert cached[0] == 0 < cached[1], cached  # cache reports on by default
        t0 = time.monotonic()
        for command in commands:
            check(session.run(command), session)
        TIMES["serve --tiny: README commands"] = time.monotonic() - t0
    finally:
        code = session.stop()
    out = session.server_output().splitlines()
    assert len(out) == 3, out  # where it starts, where it listens and what it serves, that it stopped
    assert out[0].startswith("sglang-ds41 serve: starting SGLang 0.5.23 (sglang-ds41 CPU backend), pid ")
    tiny = re.escape(str(serve_venv.cache)) + r"/tiny-trained-base-fp8-\w+"
    what = r"base release, fp8 Engram tables, \d+ tensors; sglang-ds41 CPU backend"
    ready = (
        rf"sglang-ds41 serve: ready after \d+ s: DeepSeek-V4\.1-Flash \({tiny}: {what}\) at {re.escape(url)}"
    )
    assert re.fullmatch(ready, out[1]), out[1]
    assert code == 0 and out[2].startswith("sglang-ds41 serve: stopped the server")
    log = Path(out[0].rsplit("log: ", 1)[1]).read_text()
    assert "Prefill batch" in log and " 503 " not in "\n".join(out)  # SGLang's noise went to its log


CHAT = {
    "model": "DeepSeek-V4.1-Flash",
    "messages": [{"role": "user", "content": "Hello there"}],
    "max_tokens": 2,
}


def chat(url: str) -> dict:
    request = urllib.request.Request(
        f"{url}/chat/completions", json.dumps(CHAT).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as reply:
        return json.loads(reply.read())


@pytest.mark.slow
@pytest.mark.integration
def test_the_serve_environment_meets_sglangs_own_requirements(serve_venv, cwd):
    from tests.test_cpu_environment import NOT_NEEDED_ON_CPU

    probe = (
        "import json\nfrom importlib.metadata import distribution, version, PackageNotFoundError\n"
        "from packaging.requirements import Requirement\nbad = []\n"
        f"skip = set({sorted(NOT_NEEDED_ON_CPU)!r})\n"
        "for text in distribution('sglang').requires:\n"
        "    r = Requirement(text)\n"
        "    if r.marker is not None and not r.marker.evaluate({'extra': ''}): continue\n"
        "    name = r.name.lower().replace('_', '-')\n"
        "    if name in skip: continue\n"
        "    try: got = version(r.name)\n"
        "    except PackageNotFoundError: got = None\n"
        "    if got is None or not r.specifier.contains(got, prereleases=True): bad.append((str(r), got))\n"
        "print(json.dumps(bad))"
    )
    run = serve_venv.run("python", "-c", probe, cwd=cwd)
    assert run.returncode == 0 and json.loads(run.stdout) == [], run.stdout + run.stderr

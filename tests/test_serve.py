"""`nanbeige.agent.cli.serve`: the vLLM command line and the server's lifecycle, run against a fake `vllm serve`
(a small Python script) on loopback. The availability check is `tests/test_vllm_availability.py`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import free_port

from nanbeige.agent.cli.serve import serve, server_url
from nanbeige.agent.cli.serve_config import ServeConfig, chat_template_file, real_address, vllm_args

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")

# Parses the flags it needs and ignores the rest, like a real `vllm serve` would accept them;
# `--fake-*` flags (passed as extra_args) choose how it behaves.
FAKE_VLLM = r"""
import argparse, json, os, signal, sys, threading, time
from http.server import BaseHTTPRequestHandler, HTTPServer

parser = argparse.ArgumentParser()
parser.add_argument("model")
parser.add_argument("--host")
parser.add_argument("--port", type=int)
parser.add_argument("--chat-template")
parser.add_argument("--fake-mode", default="serve")
parser.add_argument("--fake-exit-after", type=float)  # seconds after it was first seen ready, however late
parser.add_argument("--fake-record")
parser.add_argument("--fake-bind")  # the address it really binds, whatever --host says: tests stay on loopback
args, _ = parser.parse_known_args()
template = open(args.chat_template).read() if args.chat_template else None
with open(args.fake_record, "w") as f:
    json.dump({"pid": os.getpid(), "argv": sys.argv[1:], "template": template,
               "api_key": os.environ.get("VLLM_API_KEY")}, f)
print("fake vllm: loading", args.model, flush=True)
if args.fake_mode == "exit":
    print("ValueError: fake vllm cannot load the weights", file=sys.stderr, flush=True)
    sys.exit(3)
if args.fake_mode == "stubborn":  # never listens, ignores SIGINT
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        time.sleep(0.1)
time.sleep(0.3)


class Models(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"object": "list", "data": [{"id": args.model, "object": "model"}]}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        if args.fake_exit_after and self.path == "/v1/models" and not seen_ready.is_set():
            seen_ready.set()
            threading.Timer(args.fake_exit_after, lambda: os._exit(4)).start()

    def log_message(self, *args):
        pass


seen_ready = threading.Event()
server = HTTPServer((args.fake_bind or args.host, args.port), Models)
try:
    server.serve_forever()
except KeyboardInterrupt:
    print("fake vllm: shutting down", flush=True)
"""

# `serve` in its own process, so that SIGINT is delivered as a terminal's Ctrl-C would be. The
# handler is set explicitly: a process started from a non-interactive shell may inherit SIGINT ignored.
SERVE_IN_CHILD = (
    "import json, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from nanbeige.agent.cli.serve import serve; "
    "from nanbeige.agent.cli.serve_config import ServeConfig; "
    "sys.exit(serve(ServeConfig(**json.loads(sys.argv[1]))))"
)
DEFAULT_ARGS = [
    "vllm",
    "serve",
    "Nanbeige/Nanbeige4.1-3B",
    "--host",
    "127.0.0.1",
    "--port",
    "8000",
    "--served-model-name",
    "Nanbeige/Nanbeige4.1-3B",
    "--dtype",
    "bfloat16",
    "--generation-config",
    "vllm",
    "--max-model-len",
    "262144",
    "--gpu-memory-utilization",
    "0.92",
    "--data-parallel-size",
    "1",
    "--enable-prefix-caching",
]


def fake_config(tmp_path: Path, *fake_args: str, **overrides: object) -> ServeConfig:
    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE_VLLM)
    settings: dict[str, object] = {
        "port": free_port(),
        "vllm_command": [sys.executable, str(script)],
        "extra_args": ["--fake-record", str(tmp_path / "fake.json"), *fake_args],
        "startup_timeout_s": 20.0,
        "stop_grace_s": 5.0,
    }
    return ServeConfig(**(settings | overrides))  # type: ignore[arg-type]


def fake_record(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "fake.json").read_text())


def is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


# ---------------------------------------------------------------- command line


def test_defaults_serve_the_deep_search_dialect_without_parsers() -> None:
    assert vllm_args(ServeConfig()) == DEFAULT_ARGS


def test_tool_call_dialect_adds_the_hermes_tool_parser_and_a_reasoning_parser() -> None:
    args = vllm_args(ServeConfig(dialect="tool-call"))
    assert args == DEFAULT_ARGS + [
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--reasoning-parser",
        "deepseek_r1",
    ]
    assert vllm_args(ServeConfig(dialect="tool-call", reasoning_parser=None))[-1] == "hermes"
    assert vllm_args(ServeConfig(dialect="tool-call", reasoning_parser="qwen3"))[-2:] == ["--reasoning-parser", "qwen3"]


def test_rl_template_and_extra_args_come_after_the_common_flags() -> None:
    config = ServeConfig(
        model="/ckpt/step-100",
        port=9000,
        served_model_name="policy",
        data_parallel_size=4,
        enable_prefix_caching=False,
        chat_template=Path("search.jinja"),
        rl_logprobs=True,
        extra_args=["--max-num-seqs", "64"],
        vllm_command=["my-vllm"],
    )
    assert vllm_args(config) == [
        "my-vllm",
        "/ckpt/step-100",
        "--host",
        "127.0.0.1",
        "--port",
        "9000",
        "--served-model-name",
        "policy",
        "--dtype",
        "bfloat16",
        "--generation-config",
        "vllm",
        "--max-model-len",
        "262144",
        "--gpu-memory-utilization",
        "0.92",
        "--data-parallel-size",
        "4",
        "--no-enable-prefix-caching",
        "--chat-template",
        "search.jinja",
        "--logprobs-mode",
        "processed_logprobs",
        "--max-num-seqs",
        "64",
    ]


def test_an_unknown_dialect_is_refused() -> None:
    with pytest.raises(ValueError, match="mcp-xml, tool-call"):
        vllm_args(ServeConfig(dialect="xml"))


def test_the_url_of_a_wildcard_address_is_this_machine() -> None:
    assert server_url(ServeConfig(port=1234)) == "http://127.0.0.1:1234/v1"
    assert server_url(ServeConfig(host="0.0.0.0")) == "http://127.0.0.1:8000/v1"
    assert server_url(ServeConfig(host="::")) == "http://[::1]:8000/v1"


@pytest.mark.parametrize(
    ("extra_args", "address"),
    [
        ([], ("127.0.0.1", 8000)),
        (["--host", "0.0.0.0"], ("0.0.0.0", 8000)),
        (["--host=0.0.0.0", "--port=9000"], ("0.0.0.0", 9000)),
        (["--host", "0.0.0.0", "--max-num-seqs", "8", "--host", "127.0.0.1"], ("127.0.0.1", 8000)),  # last wins
        (["--ho", "::", "--por", "9001"], ("::", 9001)),  # abbreviations, which argparse accepts
        (["--hostname", "0.0.0.0"], ("127.0.0.1", 8000)),  # another flag, not an abbreviation of --host
    ],
)
def test_the_address_vllm_listens_on_is_the_last_one_said_after_the_double_dash(
    extra_args: list[str], address: tuple[str, int]
) -> None:
    config = real_address(ServeConfig(extra_args=extra_args))
    assert (config.host, config.port) == address
    assert vllm_args(config)[len(DEFAULT_ARGS) :] == extra_args  # passed through unchanged, last


@pytest.mark.parametrize(("extra_args", "words"), [(["--port=http"], "'http'"), (["--host"], "has no value")])
def test_an_address_after_the_double_dash_that_vllm_cannot_use_is_refused(extra_args: list[str], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        real_address(ServeConfig(extra_args=extra_args))


def test_the_template_of_a_tokenizer_config_is_written_to_a_file(tmp_path: Path) -> None:
    config = tmp_path / "tokenizer_config_search.json"
    config.write_text(json.dumps({"bos_token": "<|im_start|>", "chat_template": "{{ messages }}\n"}))
    (tmp_path / "out").mkdir()
    extracted = chat_template_file(config, tmp_path / "out")
    assert extracted.name == "tokenizer_config_search.jinja" and extracted.read_text() == "{{ messages }}\n"
    jinja = tmp_path / "search.jinja"
    jinja.write_text("{{ x }}")
    assert chat_template_file(jinja, tmp_path) == jinja
    (tmp_path / "bad.json").write_text(json.dumps({"bos_token": "<s>"}))
    with pytest.raises(ValueError, match="no `chat_template`"):
        chat_template_file(tmp_path / "bad.json", tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        chat_template_file(tmp_path / "missing.jinja", tmp_path)


# ---------------------------------------------------------------- lifecycle, against a fake server


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_serve_waits_for_the_server_prints_the_url_and_stops_it_on_a_signal(
    tmp_path: Path, signum: int, code: int
) -> None:
    config = fake_config(tmp_path)
    settings = {"port": config.port, "vllm_command": config.vllm_command, "extra_args": config.extra_args}
    with open(tmp_path / "stderr.txt", "w+") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-c", SERVE_IN_CHILD, json.dumps(settings)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        lines = [process.stdout.readline() for _ in range(3)]  # type: ignore[union-attr]
        url = f"http://127.0.0.1:{config.port}/v1"
        assert lines == [f"{url}\n", f"NANBEIGE_BASE_URL={url}\n", "NANBEIGE_MODEL=Nanbeige/Nanbeige4.1-3B\n"]
        assert httpx.get(f"{url}/models").json()["data"][0]["id"] == "Nanbeige/Nanbeige4.1-3B"
        process.send_signal(signum)
        assert process.wait(timeout=60) == code  # only against a hang: stopping takes at most the 5 s grace
        stderr.seek(0)
        output = stderr.read()
    assert "fake vllm: loading" in output and "fake vllm: shutting down" in output  # passed through, stopped by SIGINT
    assert not is_running(fake_record(tmp_path)["pid"]) and not accepts_connections(config.port)


def test_serve_returns_the_server_exit_code_and_hands_it_the_extracted_template(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    template = tmp_path / "tokenizer_config_search.json"
    template.write_text(json.dumps({"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}))
    config = fake_config(tmp_path, "--fake-exit-after", "1.0", chat_template=template, served_model_name="nb")
    messages: list[str] = []
    assert serve(config, messages.append) == 4
    url = f"http://127.0.0.1:{config.port}/v1"
    assert capsys.readouterr().out == f"{url}\nNANBEIGE_BASE_URL={url}\nNANBEIGE_MODEL=nb\n"
    record = fake_record(tmp_path)
    assert record["template"] == "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert record["argv"][record["argv"].index("--served-model-name") + 1] == "nb"
    assert any(m.startswith("ready at") for m in messages) and not any("warning" in m for m in messages)


def test_a_server_that_exits_during_startup_fails_with_its_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    messages: list[str] = []
    assert serve(fake_config(tmp_path, "--fake-mode", "exit"), messages.append) == 3
    error = next(m for m in messages if m.startswith("error:"))
    assert "exited with code 3 before it was ready" in error
    assert "ValueError: fake vllm cannot load the weights" in error and "fake vllm: loading" in error
    assert capsys.readouterr().out == ""  # no URL announced


def test_a_server_that_never_answers_is_killed_after_the_timeout(tmp_path: Path) -> None:
    config = fake_config(tmp_path, "--fake-mode", "stubborn", startup_timeout_s=1.0, stop_grace_s=0.5)
    messages: list[str] = []
    started = time.monotonic()
    assert serve(config, messages.append) == 1
    # given up at the 1 s limit and killed after the 0.5 s grace: many times that on a busy machine, but
    # not the wait forever of a server that never answers
    assert time.monotonic() - started < 30
    assert any("did not answer" in m and "within 1 s" in m for m in messages)
    assert any("killing it" in m for m in messages)
    assert not is_running(fake_record(tmp_path)["pid"])


def test_a_taken_port_or_a_missing_template_fails_before_starting(tmp_path: Path) -> None:
    messages: list[str] = []
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert serve(fake_config(tmp_path, port=port), messages.append) == 1
    assert messages == [f"error: something already listens on 127.0.0.1:{port}; choose another port"]
    assert serve(fake_config(tmp_path, chat_template=tmp_path / "nope.jinja"), messages.append) == 2
    assert messages[-1] == f"error: chat template {tmp_path / 'nope.jinja'} does not exist"
    assert not (tmp_path / "fake.json").exists()


def test_a_missing_vllm_fails_in_serve_too(tmp_path: Path) -> None:
    messages: list[str] = []
    assert serve(fake_config(tmp_path, vllm_command=["no-such-vllm-here", "serve"]), messages.append) == 1
    assert "vLLM is not installed" in messages[-1]


def test_the_deep_search_template_beside_the_weights_is_used_by_name(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer_config_search.json").write_text(json.dumps({"chat_template": "SEARCH {{ messages }}"}))
    config = fake_config(tmp_path, "--fake-exit-after", "1.0", model=str(model))
    messages: list[str] = []
    serve(config, messages.append)
    assert fake_record(tmp_path)["template"] == "SEARCH {{ messages }}"
    assert any("using the deep-search chat template" in m for m in messages)
    assert not any("warning" in m for m in messages)


# ---------------------------------------------------------------- the address after `--`


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--weight-sync", "--", "--host", "0.0.0.0"], ["--weight-sync", "refused", "--host 0.0.0.0"]),
        (["--", "--host=0.0.0.0"], ["opens the server to the network", "--api-key", "--no-api-key"]),
        (["--", "--port", "web"], ["--port after --", "'web'"]),
    ],
)
def test_serve_checks_the_address_said_after_the_double_dash(flags: list[str], words: list[str]) -> None:
    result = subprocess.run(
        [NANBEIGE, "serve", *flags],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200", "NANBEIGE_API_KEY": "", "VLLM_API_KEY": ""},
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    error = " ".join(line for line in result.stderr.splitlines() if line.startswith("error:"))
    assert all(word in error for word in words), result.stderr


def test_weight_sync_is_refused_when_the_double_dash_opens_the_server(tmp_path: Path) -> None:
    config = fake_config(tmp_path, "--host", "0.0.0.0", weight_sync=True, api_key="k" * 16)
    messages: list[str] = []
    assert serve(config, messages.append) == 2
    assert "--weight-sync" in messages[0] and "refused" in messages[0]
    assert not (tmp_path / "fake.json").exists()  # never started


def test_the_ready_line_names_the_address_said_after_the_double_dash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    # the fake binds loopback whatever --host says: no test listens beyond this machine
    extra = ["--host=0.0.0.0", "--port", str(port), "--fake-bind", "127.0.0.1", "--fake-exit-after", "0.5"]
    config = fake_config(tmp_path, *extra, no_api_key=True)
    messages: list[str] = []
    assert serve(config, messages.append) == 4
    url = f"http://127.0.0.1:{port}/v1"
    assert capsys.readouterr().out.splitlines()[0] == url
    ready = next(text for text in messages if text.startswith("ready at"))
    assert ready.startswith(f"ready at {url} ") and "listening on every interface, no API key" in ready

"""The model side of setup: the model server to use (or the model in this process), the settings
fitted to it, and the backend that talks to it.

One request to the model server comes first (seconds); loading a model in this process (tens of
seconds) comes last, after the tool servers started. A pool of servers (`--base-url` given more than
once) is asked as a whole and used through one client, `backends/pool.py`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from nanbeige.agent.backends.in_process import in_thread, loading
from nanbeige.agent.backends.llm import (
    LLM,
    LLMConfig,
    ModelError,
    ModelUnavailable,
    OpenAIChat,
    ServerInfo,
    probe_server,
)
from nanbeige.agent.backends.prompts import search_template
from nanbeige.agent.run.loop import DEFAULT_MAX_CONTEXT
from nanbeige.agent.run.run_config import RunSettings
from nanbeige.agent.setup.setup_checks import SetupError

Notice = Callable[[str], None]


async def find_model(settings: RunSettings, notice: Notice) -> tuple[RunSettings, ServerInfo | None]:
    """The model server and the settings fitted to it; None for the server when the model runs in this process."""
    server = await in_thread(find_model_server, settings, notice)
    if server is None:
        settings = await in_thread(in_process, settings, notice)
    return fit_to_server(for_dialect(settings), server, notice), server


def find_model_server(settings: RunSettings, notice: Notice) -> ServerInfo | None:
    """The model server to use and what it says about itself; None when the model runs in this process
    (after checking it can be had: a local folder, downloaded, or a hub that answers).
    `auto` falls back to this process only from the default address, never from one the user named."""
    from nanbeige.agent.backends.local_model import LocalModelError, check_model_available, resolve_small_model

    b, c = settings.backend, settings.llm
    if c.more_base_urls:  # the runs must fit the smallest context of the pool
        servers = pool_servers(settings)
        lengths = [info.max_model_len for info in servers if info.max_model_len]
        return dataclasses.replace(servers[0], max_model_len=min(lengths) if lengths else None)
    wanted = b.token_mode or b.backend == "openai" or (b.backend == "auto" and b.base_url_given)
    if b.backend != "transformers":
        try:
            server = probe_server(c.base_url, c.api_key, timeout=10.0 if wanted else 2.0, model=c.model)
            if b.token_mode and not server.vllm:
                raise SetupError(
                    f"--token-mode needs a vLLM server (it sends token ids to /v1/completions); the "
                    f"server at {c.base_url} is not vLLM. Start one with `nanbeige serve --rl-logprobs`."
                )
            return server
        except ModelUnavailable as exc:
            if wanted:
                fix = (
                    "token mode needs a vLLM server: start one with `nanbeige serve --rl-logprobs`"
                    if b.token_mode
                    else "Start one with `nanbeige serve`, point --base-url / NANBEIGE_BASE_URL at a running "
                    "OpenAI-compatible server, or use --backend transformers to run the model in this process."
                )
                raise SetupError(f"cannot reach the model server at {c.base_url} ({exc}). {fix}") from None
        notice(
            f"no model server at {c.base_url}: running {c.model} in this process (start one with "
            "`nanbeige serve` for speed)"
        )
    try:
        check_model_available(*resolve_small_model(c.model, b.gguf_file))
    except LocalModelError as exc:
        raise SetupError(str(exc)) from None
    return None


def pool_servers(settings: RunSettings) -> list[ServerInfo]:
    """What every endpoint of a pool says about itself; one line naming those that differ or do not answer."""
    from nanbeige.agent.backends.pool import ask_endpoints

    c = settings.llm
    return ask_endpoints(c.urls(), c.api_key, c.model, settings.backend.token_mode)


def in_process(settings: RunSettings, notice: Notice) -> RunSettings:
    """The settings for a model run in this process: on a CPU, a reply length and a number of turns a CPU gets
    through where the user left the defaults (said on stderr). The model keeps the name typed (`smollm2`)."""
    from nanbeige.agent.backends.in_process import CPU_MAX_TOKENS, CPU_MAX_TURNS, on_cpu
    from nanbeige.agent.backends.local_model import LocalModelError

    b, llm, agent = settings.backend, settings.llm, settings.agent
    try:
        cpu = on_cpu()
    except LocalModelError as exc:
        raise SetupError(str(exc)) from None
    cut = []
    if cpu and llm.max_tokens == LLMConfig.max_tokens:  # the default, not the user's choice
        llm = dataclasses.replace(llm, max_tokens=CPU_MAX_TOKENS)
        cut.append(f"--max-tokens {CPU_MAX_TOKENS}")
    if cpu and agent.max_turns is None:
        agent = dataclasses.replace(agent, max_turns=CPU_MAX_TURNS)
        cut.append(f"--max-turns {CPU_MAX_TURNS}")
    if cut:
        notice(f"on the CPU: {' and '.join(cut)} (a CPU generates a few tokens a second; set them to go further)")
    return dataclasses.replace(settings, llm=llm, backend=b, agent=agent)


def for_dialect(settings: RunSettings) -> RunSettings:
    """The settings with what the user left unset (sampling, max turns, ...) taken from the dialect's defaults."""
    agent = settings.agent
    return dataclasses.replace(settings, llm=settings.llm.for_dialect(agent.dialect), agent=agent.for_dialect())


def fit_to_server(settings: RunSettings, server: ServerInfo | None, notice: Notice) -> RunSettings:
    """The settings with the context length filled in (as given, else as the server reports it) and,
    when the default reply length would not fit in a small server context, a shorter one."""
    agent, llm = settings.agent, settings.llm
    if agent.max_context is not None:
        return settings
    max_context = (server.max_model_len if server else None) or DEFAULT_MAX_CONTEXT
    if llm.max_tokens + agent.context_reserve >= max_context:
        if llm.max_tokens != LLMConfig.max_tokens:  # the user asked for this length
            raise SetupError(
                f"--max-tokens {llm.max_tokens} leaves no room for a prompt in the server's context of "
                f"{max_context} tokens; pass a smaller --max-tokens",
                usage=True,
            )
        llm = dataclasses.replace(llm, max_tokens=max_context // 4)
        notice(
            f"replies shortened: the server's context is {max_context} tokens, so --max-tokens is "
            f"{llm.max_tokens} (the default {LLMConfig.max_tokens} would leave no room for a prompt)"
        )
    return dataclasses.replace(settings, llm=llm, agent=dataclasses.replace(agent, max_context=max_context))


async def start_backend(settings: RunSettings, server: ServerInfo | None, notice: Notice) -> LLM:
    """The backend, made off the event loop; loading a model in this process is shown as it goes."""
    if server is not None:
        return await in_thread(make_llm, settings, server)
    with loading(notice, settings.llm.model):  # tens of seconds: shown as they go where the notice can
        return await in_thread(make_llm, settings, server)


def make_llm(settings: RunSettings, server: ServerInfo | None) -> LLM:
    """The model backend: a client of the server found, or the model loaded in this process (slow)."""
    b, c = settings.backend, settings.llm
    if server is not None and c.more_base_urls:
        return make_pool(settings, server)
    if server is not None and b.token_mode:
        return token_mode_client(settings, server)
    if server is not None:
        return OpenAIChat(c, server=server)
    from nanbeige.agent.backends.in_process import TransformersLLM
    from nanbeige.agent.backends.local_model import LocalModelError

    try:
        return TransformersLLM(c, gguf_file=b.gguf_file, verbose=b.verbose, chat_template=in_process_template(settings))
    except LocalModelError as exc:
        raise SetupError(str(exc)) from None


def template_file(settings: RunSettings, source: str) -> Path | None:
    """The chat template file prompts are rendered with here (token mode, the in-process model): `--chat-template`,
    else in the mcp-xml dialect the deep-search template beside `source`'s weights; None: the tokenizer's own."""
    if settings.backend.chat_template:
        return settings.backend.chat_template
    return search_template(source) if settings.agent.dialect == "mcp-xml" else None


def in_process_template(settings: RunSettings) -> tuple[str, str] | None:
    """The in-process model's chat template (`template_file`), as its name and text."""
    from nanbeige.agent.backends.prompts import read_chat_template

    chosen = template_file(settings, settings.llm.model)
    if chosen is None:
        return None
    try:
        return chosen.name, read_chat_template(chosen)
    except (OSError, ValueError) as exc:
        raise SetupError(f"cannot read the chat template {chosen}: {exc}") from None


def make_pool(settings: RunSettings, server: ServerInfo) -> LLM:
    """One client per endpoint (in token mode sharing one tokenizer), used as one pool."""
    from nanbeige.agent.backends.pool import EndpointPool, member_config
    from nanbeige.agent.backends.token_mode import TokenModeChat

    configs = [member_config(settings.llm, url) for url in settings.llm.urls()]
    if settings.backend.token_mode:
        first = token_mode_client(dataclasses.replace(settings, llm=configs[0]), server)
        assert isinstance(first, TokenModeChat)
        members: list[OpenAIChat] = [first, *(first.at(config) for config in configs[1:])]
    else:
        members = [OpenAIChat(config, server=server) for config in configs]
    return EndpointPool(members, settings.llm, route=settings.backend.route)


def token_mode_client(settings: RunSettings, server: ServerInfo) -> LLM:
    """The token-mode client, its tokenizer from `--tokenizer`, else the first that loads of the folder the
    server lists as the model's root (when it is a folder here) and the model name."""
    from nanbeige.agent.backends.dequantized import plain_folder
    from nanbeige.agent.backends.local_model import check_model_available
    from nanbeige.agent.backends.token_mode import TokenModeChat, load_tokenizer

    b, c = settings.backend, settings.llm
    root = server.weights if server.weights and Path(server.weights).is_dir() else None
    sources = [b.tokenizer] if b.tokenizer else list(dict.fromkeys(s for s in (root, c.model) if s))
    problems = []
    for source in sources:
        try:
            folder = plain_folder(source)  # the small model's GGUF package: its de-quantized copy's tokenizer
            check_model_available(folder, fixes="pass --tokenizer with the model's folder")
            chosen = template_file(settings, folder)
            tokenizer, template = load_tokenizer(folder, chosen)
            return TokenModeChat(c, tokenizer, template, template_name=chosen and chosen.name)
        except (ModelError, OSError) as exc:
            problems.append(str(exc))
    if b.tokenizer:
        raise SetupError(problems[0])
    raise SetupError(
        f"token mode needs the model's tokenizer: {'; '.join(problems)}. Pass --tokenizer with the "
        "model's folder or Hugging Face id"
    )

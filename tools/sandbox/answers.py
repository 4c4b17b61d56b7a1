"""What the tools answer, in the text shapes of E2B's SDK (`str(Execution)`, `str(CommandResult)`, its
exceptions): what the model saw during training. Both backends answer in them."""

from __future__ import annotations

from nanbeige.tools.sandbox.sandbox_config import ERROR_DETAIL_CHARS

TRUNCATED = " [Result truncated due to length limit]"


def format_execution(results: list[str], stdout: str, stderr: str, error: dict[str, str] | None) -> str:
    """The text of E2B's `str(Execution)`: what the model saw during training."""
    logs = f"Logs(stdout: {[stdout] if stdout else []!r}, stderr: {[stderr] if stderr else []!r})"
    if error is not None:
        name, value, tb = error["name"], error["value"], error["traceback"]
        error_text = f"ExecutionError(name={name!r}, value={value!r}, traceback={tb!r})"
    else:
        error_text = "None"
    return f"Execution(Results: [{', '.join(f'Result({r})' for r in results)}], Logs: {logs}, Error: {error_text})"


def format_command(stdout: str, stderr: str, exit_code: int, error: str | None) -> str:
    """The text of E2B's `str(CommandResult)`."""
    return f"CommandResult(stderr={stderr!r}, stdout={stdout!r}, exit_code={exit_code!r}, error={error!r})"


def command_failed(exit_code: int, stderr: str, signal_text: str | None = None) -> str:
    """The error text for a command that exited non-zero. E2B raises `CommandExitException` then, and
    the reference server answered with its text (stderr only, no stdout) in this layout."""
    code = f"{exit_code} ({signal_text})" if signal_text else f"{exit_code}"
    details = f"Command exited with code {code} and error:\n{stderr}"
    return f"Failed to run command.\n\nException type: CommandExitException\nDetails: {details[:ERROR_DETAIL_CHARS]}"


def truncate(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[:max_chars] + TRUNCATED


def placeholder_answer(template: str, sandbox_id: str) -> str:
    """A `str.format` template with `{sandbox_id}` filled in; one that needs other fields is shown as it is."""
    try:
        return template.format(sandbox_id=sandbox_id)
    except (IndexError, KeyError, ValueError, AttributeError):
        return template


def invalid_id(sandbox_id: str) -> str:
    return (
        f"'{sandbox_id}' is not a valid sandbox_id. Please create a real sandbox first using the create_sandbox tool."
    )

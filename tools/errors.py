"""The one base of the errors a person is shown: something they must fix, said in one line. The command
line handles every such error in one place (`nanbeige.agent.cli.running.Program`): its message on stderr
after `error:`, then its exit code; so a command raises it and catches nothing. It lives here, in the
lowest layer, so that every package can derive from it. Signals between parts of the code (a retry, a
time limit, a cache miss) are no such error and do not derive from it."""


class NanbeigeError(Exception):
    """An error the user must fix; its message (one line, it names the fix) is what they see."""

    exit_code = 1
    """The program's exit status when this error ends a command: 1, or 2 for a usage error (a bad flag
    or value)."""


class ServiceUnavailable(NanbeigeError):
    """A service nanbeige calls cannot be used until the user fixes something: a model server, a judge, a
    critic or a search backend that cannot be reached, refuses the key, or keeps failing past its retries.
    Never a verdict on an answer or a turn: the caller stops, or another endpoint is asked, and the same
    command goes on once the service is back."""

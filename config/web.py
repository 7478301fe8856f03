"""daphne on the chosen event loop (config/loop.py), ending at once when it has stopped:
``python -m config.web [daphne's arguments]``."""

from config.loop import choose
from config.process import leave, settle_heap

choose()  # before daphne.server makes its loop

from daphne.cli import CommandLineInterface  # noqa: E402
from twisted.internet import reactor  # noqa: E402  (daphne's: installed by daphne.cli's import)

from config.bad_requests import answer_bad_requests_as_problems  # noqa: E402
from config.redact import redact_daphne_access_log  # noqa: E402

redact_daphne_access_log()  # its access log names paths: a share link's token is one
reactor.callWhenRunning(settle_heap)  # (the application is loaded by then)
answer_bad_requests_as_problems()  # a 20 KB bearer token is answered, and what is refused is a problem

if __name__ == "__main__":
    try:
        CommandLineInterface.entrypoint()
    except SystemExit as exit:  # a usage error: its status, as daphne's own command would
        leave(exit.code if isinstance(exit.code, int) else 1)
    leave(0)  # the reactor has stopped: skip Python's slow finalisation (config/process.py)

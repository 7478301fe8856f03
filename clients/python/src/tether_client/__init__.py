"""Tether's Python client: durable commands and shells over the HTTP API, with honest outcomes.

    from tether_client import Client

    with Client("https://tether.example.com", token) as tether:
        run = tether.submit("agent-7", "task-42", machine="box", argv=["make", "test"]).execution
        for piece in tether.stream(run.id):
            ...

See clients/python/README.md.
"""

from tether_client.calls import Retry
from tether_client.client import Client
from tether_client.errors import GaveUp, InputUnconfirmed, Problem, TetherError
from tether_client.models import Chunk, Execution, Outcome, Output, Submission, TerminalState, Written
from tether_client.numbered import Stdin, Terminal

__all__ = [
    "Chunk", "Client", "Execution", "GaveUp", "InputUnconfirmed", "Outcome", "Output", "Problem", "Retry", "Stdin",
    "Submission", "Terminal", "TerminalState", "TetherError", "Written",
]  # fmt: skip

"""The body of a reward worker process, and a fault-injecting verifier for tests and drills.

Kept torch-free (it imports only the tokenizer and the task's checker), so that a worker spawned to
replace a killed one is ready in a fraction of a second.
"""

from __future__ import annotations

import importlib
import os
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from examples.llm.arithmetic import check_answer
from examples.llm.tokenizer import CharTokenizer


def resolve(path: str) -> Callable[..., float]:
    """The function named by "package.module:function"."""
    module, _, name = path.partition(":")
    if not module or not name:
        raise ValueError(f"verifier must be 'package.module:function', got {path!r}")
    fn = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        raise ValueError(f"verifier {path!r} does not name a function")
    return fn


def worker_main(conn: Connection, verifier: str, kwargs: dict[str, Any], tokenizer_hash: str) -> None:
    """Serve `(ticket, token ids, answer)` requests until a `None` request or a closed pipe.

    Replies `(ticket, reward, error)`; a verifier exception becomes reward 0 with the error text (the
    parent counts it). Anything worse (a hang, a crash, a kill) is the parent's business: it watches the
    clock and the process sentinel.
    """
    tok = CharTokenizer()
    tok.check(tokenizer_hash, f"reward worker {os.getpid()}")
    fn = resolve(verifier)
    conn.send(("ready", os.getpid(), None))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        ticket, ids, answer = msg
        try:
            conn.send((ticket, float(fn(tok.decode(ids), answer, **kwargs)), None))
        except Exception as e:  # noqa: BLE001 - the verifier's fault, not the worker's: report and keep serving
            conn.send((ticket, 0.0, f"{type(e).__name__}: {e}"))


def faulty_check(completion: str, answer: int, reverse: bool = True) -> float:
    """`check_answer`, except that a few magic answers inject faults (for tests and failure drills).

    answer -1: hang for an hour (a slow sandbox); -2: raise (a verifier bug); -3: SIGKILL this worker
    (an OOM kill mid-batch); -4: sleep 0.2 s, then score normally (a slow but healthy item).
    """
    if answer == -1:
        time.sleep(3600)
    if answer == -2:
        raise RuntimeError("injected verifier failure")
    if answer == -3:
        os.kill(os.getpid(), signal.SIGKILL)
    if answer == -4:
        time.sleep(0.2)
    return check_answer(completion, answer, reverse)

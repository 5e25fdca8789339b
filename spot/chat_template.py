"""Chat templates rendered with bounded resources.

Jinja's sandbox keeps a template from running code, not from exhausting the machine: `'x' * 4000000000` or loops
nested over range(100000) ran for minutes and took gigabytes. A template is data a checkpoint (or `--chat-template`)
brings, so every rendering happens here, in a child process (started on first use, reused after) that has at most
RenderLimits.memory_bytes of address space, is killed when a render takes longer than RenderLimits.seconds, and stops
a render whose text grows past RenderLimits.max_chars. Each limit is a SpotError naming it; so is any other failure
of the template (a syntax error, raise_exception, 1/0, endless recursion).
"""
from __future__ import annotations

import atexit
import functools
import json
import math
import os
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
import resource
import signal

from spot.errors import SpotError

TEMPLATE_HINT = "use the prompt as raw text: tokenizer.encode(text) (CLI: --no-chat)"
STARTUP_S = 60.0        # the child's interpreter and jinja2 import, outside a render's own time (a busy machine)


@dataclass(frozen=True)
class RenderLimits:
    """What one rendering may use: wall-clock seconds, bytes of the child's address space (its interpreter, ~25 MB,
    included) and characters of rendered text (a chat prompt longer than any context is refused as it grows)."""

    seconds: float = 5.0
    memory_bytes: int = 2**30
    max_chars: int = 2**24


def render_chat_template(template: str, messages: list, add_generation_prompt: bool = True,
                         limits: RenderLimits = RenderLimits()) -> str:
    """The template rendered (jinja2's sandbox, as transformers renders chat templates) for `messages` (JSON
    values); SpotError when it fails or exceeds `limits`."""
    try:
        request = json.dumps({"template": template, "messages": messages, "add_generation_prompt":
                              add_generation_prompt, "max_chars": limits.max_chars, "seconds": limits.seconds})
    except (TypeError, ValueError) as e:
        raise SpotError(f"chat messages must be JSON values (text, numbers, lists, objects), got {e}",
                        'e.g. [{"role": "user", "content": "Hello"}]') from None
    answer = _RENDERER.render(request, limits)
    if "text" in answer:
        return answer["text"]
    raise SpotError(*failure_message(answer, limits))


def failure_message(answer: dict, limits: RenderLimits) -> tuple[str, str]:
    """The child's {"error": kind, "detail": ...} in words: (message, hint)."""
    kind, broken = answer.get("error"), "the template (tokenizer_config.json's chat_template, or --chat-template)"
    if kind == "too_long":
        return (f"the chat template rendered more than {limits.max_chars} characters: longer than the model's "
                "context holds, or a template that repeats text without end",
                f"shorten the messages; if they are short, {broken} is broken")
    if kind == "memory":
        return (f"the chat template needed more than {limits.memory_bytes / 2**20:g} MiB of memory to render",
                f"{broken} is broken: use another one")
    if kind == "timeout":
        return (f"the chat template took longer than {limits.seconds:g} s to render",
                f"{broken} is broken: use another one")
    if kind == "stopped":
        return f"the chat template stopped the process rendering it ({answer.get('detail')})", TEMPLATE_HINT
    return f"the chat template failed to render ({answer.get('detail')})", TEMPLATE_HINT


class Renderer:
    """The child process that renders (one at a time; started on first use, again after it was killed)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None

    def render(self, request: str, limits: RenderLimits) -> dict:
        with self._lock:
            proc = self._started(limits.memory_bytes)
            try:
                proc.stdin.write(request.encode("ascii") + b"\n")
                proc.stdin.flush()
                line = read_line(proc.stdout.fileno(), time.monotonic() + limits.seconds)
            except (BrokenPipeError, EOFError):
                self._stop()
                return {"error": "stopped", "detail": f"exit status {proc.wait()}"}
            except BaseException:       # (Ctrl-C): its answer, still to come, must not be the next request's
                self._stop()
                raise
            if line is None:
                self._stop()
                return {"error": "timeout"}
            return json.loads(line)

    def _started(self, memory_bytes: int) -> subprocess.Popen:
        if self._proc is not None and (self._proc.poll() is not None or self._proc.args[-1] != str(memory_bytes)):
            self._stop()
        if self._proc is None:
            # the parent's sys.path: the child imports the same spot (a checkout, PYTHONPATH) and jinja2
            code = f"import sys; sys.path[:] = {sys.path!r}; from spot.chat_template import serve; serve()"
            self._proc = subprocess.Popen([sys.executable, "-c", code, str(memory_bytes)], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
            try:
                ready = read_line(self._proc.stdout.fileno(), time.monotonic() + STARTUP_S)
            except EOFError:
                ready = None
            if ready != b'"ready"\n':
                self._stop()
                raise SpotError("the process that renders chat templates did not start",
                                f"check that {sys.executable} imports jinja2 (pip install jinja2)")
        return self._proc

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for pipe in (self._proc.stdin, self._proc.stdout):
                pipe.close()
            self._proc = None

    def close(self) -> None:
        with self._lock:
            self._stop()

    def forget(self) -> None:
        """In a forked child: the parent's renderer (and a lock another thread may have held) are not this
        process's; it starts its own."""
        self._lock, self._proc = threading.Lock(), None


def read_line(fd: int, deadline: float) -> bytes | None:
    """One line from the pipe `fd`, None when it does not come by `deadline` (time.monotonic); EOFError when the
    writer closed it."""
    data = bytearray()
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 2**20)
        if not chunk:
            raise EOFError
        data += chunk
    return bytes(data)


_RENDERER = Renderer()
atexit.register(_RENDERER.close)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_RENDERER.forget)


# --- the child ---------------------------------------------------------------------------------------------------

class TooLong(Exception):
    """The rendered text passed max_chars."""


def serve() -> None:
    """The child's loop: one JSON request a line on stdin, one JSON answer a line on stdout, until stdin closes."""
    memory = int(sys.argv[-1])
    try:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    except (ValueError, OSError):       # (macOS refuses RLIMIT_AS: the time and length limits remain)
        pass
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="ascii")
    sys.stdout = sys.stderr         # the answers' channel carries nothing else
    import jinja2       # noqa: F401 - before "ready": its import is not a render's time
    out.write('"ready"\n')
    out.flush()
    for line in sys.stdin:
        out.write(json.dumps(render_answer(line, signal.alarm)) + "\n")
        out.flush()


def render_answer(line: str, alarm) -> dict:
    """The answer to one request line: {"text": ...} or {"error": kind, "detail": ...}."""
    try:
        request = json.loads(line)
        # the parent kills a render past its time; should the parent be gone, SIGALRM's default action ends it
        alarm(math.ceil(request["seconds"]) + 2)
        return {"text": render_bounded(request["template"], request["messages"], request["add_generation_prompt"],
                                       request["max_chars"])}
    except TooLong:
        return {"error": "too_long"}
    except MemoryError:
        return {"error": "memory"}
    except Exception as e:      # noqa: BLE001 - whatever the template raises is the template's failure
        return {"error": "failed", "detail": f"{type(e).__name__}: {e}"[:500]}
    finally:
        alarm(0)


def render_bounded(template: str, messages: list, add_generation_prompt: bool, max_chars: int) -> str:
    pieces, size = [], 0
    for piece in compiled(template).generate(messages=messages, add_generation_prompt=add_generation_prompt):
        size += len(piece)
        if size > max_chars:
            raise TooLong
        pieces.append(piece)
    return "".join(pieces)


@functools.lru_cache(maxsize=8)
def compiled(template: str):
    # jinja2: loaded when a chat template renders, not at start-up
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, indent=None):  # transformers' tojson: keep non-ASCII, no HTML escaping
        return json.dumps(value, ensure_ascii=False, indent=indent)

    # trim_blocks / lstrip_blocks as transformers sets them: the templates rely on it for their whitespace.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)

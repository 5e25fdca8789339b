"""The OpenAI API's shapes as `spot serve` speaks them: request schemas (completions, chat completions) with spot's
extra fields, and the bodies of responses, stream chunks and errors.

Extra request fields: decoder, budget (nodes or "auto"), depth, mode, tau, top_k; `seed` as OpenAI's (left out: a
random one, reported back). Extra response fields: each choice's (and stream chunk's) `token_ids`, the top-level
`seed`, and spot's pass figures in `usage` (spot.serve.jobs.usage). OpenAI fields spot cannot honour (n > 1,
logprobs, penalties, stop strings, tools, ...) are refused with a 400 when set to anything but their no-op value;
other unknown fields are ignored, as OpenAI's own clients send some (user, metadata).
"""
from __future__ import annotations

import json
import reprlib
import time
import uuid

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from spot.errors import SpotError

# fields of OpenAI's API that change the result and spot does not implement -> the values that change nothing
NO_OP_VALUES = {"n": (1,), "best_of": (1,), "echo": (False,), "logprobs": (False, 0), "top_logprobs": (0,),
                "presence_penalty": (0,), "frequency_penalty": (0,), "repetition_penalty": (1,), "logit_bias": ({},),
                "stop": ("", []), "suffix": ("",), "tools": ([],), "functions": ([],), "tool_choice": ("none",),
                "response_format": ({"type": "text"},)}
MAX_MESSAGE_CHARS = 1000      # of an error's message: a value it quotes is cut short (a body may be 16 MiB)


def _short_repr() -> reprlib.Repr:
    r = reprlib.Repr()
    r.maxstring = r.maxother = 80
    r.maxlist = r.maxdict = r.maxtuple = 8
    r.maxlevel = 3
    return r


_SHORT = _short_repr()


def shown(value) -> str:
    """A request's value as an error message quotes it: repr cut to a few dozen characters and three levels of
    nesting (a body of 16 MiB, or nested hundreds deep, was quoted whole)."""
    return _SHORT.repr(value)


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    include_usage: bool = False


class DecodingRequest(BaseModel):
    """The fields completions and chat completions share."""

    model_config = ConfigDict(strict=True, extra="allow")
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # spot's own
    decoder: str | None = None
    budget: int | str | None = None     # nodes or "auto": checked by spot.app.tuned_budgets.budget_nodes
    depth: int | None = None
    mode: str | None = None
    tau: float | None = None
    top_k: int | None = None

    def check_supported(self) -> None:
        """SpotError for an OpenAI field spot does not implement, set to a value that would change the result."""
        for name, value in (self.model_extra or {}).items():
            if name in NO_OP_VALUES and value is not None and value not in NO_OP_VALUES[name]:
                raise SpotError(f"{name} is not supported by spot serve, got {shown(value)}",
                                f"leave {name} out (spot supports: temperature, top_p, top_k, seed, max_tokens, "
                                "decoder, budget, depth, mode, tau)")


class CompletionRequest(DecodingRequest):
    prompt: object          # text, or token ids (checked by prompt_text_or_ids, the ids by check_request)

    def prompt_text_or_ids(self) -> str | list[int]:
        """The one prompt: text or token ids (a list of one text / one id list is that prompt); SpotError
        otherwise."""
        prompt = self.prompt
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
            raise SpotError(f"prompt holds {len(prompt)} prompts, expected one (text, or a list of token ids)",
                            "send one request per prompt (they run concurrently on the server's engines)")
        if not isinstance(prompt, list):
            raise SpotError(f"field 'prompt' must be text or a list of token ids, got {shown(prompt)}",
                            'e.g. "prompt": "def add(a, b):" or "prompt": [316, 863, 8]')
        bad = next((i for i, p in enumerate(prompt) if not isinstance(p, int) or isinstance(p, bool)), None)
        if bad is not None:
            raise SpotError(f"field 'prompt': token ids must be integers, got {shown(prompt[bad])} at index {bad}",
                            'e.g. "prompt": [316, 863, 8], or the prompt as text')
        return prompt


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    role: str
    content: object = None      # text, or a list of {"type": "text", "text": ...} parts

    def as_template_message(self) -> dict:
        """{"role", "content"} with the text parts joined (spot's models read text only); SpotError otherwise."""
        content = self.content
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise SpotError(f"message content parts must be {{\"type\": \"text\", \"text\": ...}}, got "
                                f"{shown(content)}", "send text (spot's models read text only)")
            content = "".join(p["text"] for p in content)
        if content is not None and not isinstance(content, str):
            raise SpotError(f"field 'content' of a message must be text, got {shown(content)}",
                            'e.g. {"role": "user", "content": "hello"}')
        return {"role": self.role, "content": content or ""}


class ChatRequest(DecodingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None


def parse_request(kind: type[DecodingRequest], body: bytes) -> DecodingRequest:
    """A request body -> the request; SpotError saying what is wrong (not UTF-8, not JSON, a missing or mistyped
    field, an unsupported one)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpotError(f"the request body is not UTF-8 text (byte {e.start}: {body[e.start:e.start + 1]!r})",
                        "send a JSON body encoded as UTF-8") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise SpotError("the request body nests arrays or objects too deeply to read",
                        "send a JSON object of the request's fields (OpenAI's API nests them a few levels)") from None
    except json.JSONDecodeError as e:
        raise SpotError(f"the request body is not JSON ({e})", "send a JSON object") from None
    except ValueError as e:     # an integer of more digits than Python converts (4300)
        raise SpotError(f"the request body holds a number too long to read ({e})",
                        "send numbers of at most a few digits") from None
    if not isinstance(data, dict):
        raise SpotError(f"the request body is a JSON {type(data).__name__}, expected an object",
                        "send a JSON object of the request's fields")
    try:
        request = kind.model_validate(data)
    except ValidationError as e:
        raise SpotError(*validation_message(e)) from None
    request.check_supported()
    return request


def validation_message(e: ValidationError) -> tuple[str, str]:
    """The first problem pydantic found, in words: (message, hint)."""
    err = e.errors()[0]
    where = ".".join(str(part) for part in err["loc"])
    field = str(err["loc"][0]) if err["loc"] else "the request"
    if err["type"] == "missing":
        return f"the request has no {where!r} field", f"add {field!r} (see the OpenAI API's fields)"
    return (f"field {where!r}: {err['msg']}, got {shown(err.get('input'))}",
            f"check {field!r} (see the OpenAI API's fields and docs/deployment.md for spot's)")


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def created_now() -> int:
    return int(time.time())


def response_body(chat: bool, rid: str, created: int, model: str, text: str, token_ids: list[int],
                  finish_reason: str, usage: dict, seed: int) -> dict:
    """A whole (not streamed) completion or chat completion."""
    choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason,
               "logprobs": None, "token_ids": token_ids} if chat else
              {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None, "token_ids": token_ids})
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
            "model": model, "choices": [choice], "usage": usage, "seed": seed}


def chunk_body(chat: bool, rid: str, created: int, model: str, piece: str | None, token_ids: list[int],
               finish_reason: str | None = None, role: bool = False, seed: int | None = None) -> dict:
    """One streamed chunk: a finished block's text and ids (finish_reason on the last; role on a chat's first)."""
    if chat:
        delta = {"role": "assistant"} if role else {}
        if piece is not None:
            delta["content"] = piece
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None,
                  "token_ids": token_ids}
    else:
        choice = {"index": 0, "text": piece or "", "finish_reason": finish_reason, "logprobs": None,
                  "token_ids": token_ids}
    body = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
            "model": model, "choices": [choice]}
    if seed is not None:
        body["seed"] = seed
    return body


def usage_chunk_body(chat: bool, rid: str, created: int, model: str, usage: dict) -> dict:
    """The last chunk of a stream with stream_options.include_usage: no choices, the usage."""
    return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
            "model": model, "choices": [], "usage": usage}


def model_object(name: str, created: int, manifest_sha256: str | None) -> dict:
    """A model as GET /v1/models lists it and GET /v1/models/{id} returns it."""
    return {"id": name, "object": "model", "created": created, "owned_by": "spot", "manifest_sha256": manifest_sha256}


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error shape. The message cut to MAX_MESSAGE_CHARS, and a lone surrogate it quotes (JSON's
    "\\ud800" reads as one) escaped: the response is UTF-8, and such a character made its encoding fail."""
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + "..."
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}

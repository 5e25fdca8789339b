"""The errors `spot serve` answers with, in OpenAI's error shape: HTTPError (a status and the body's fields), a
user's SpotError as a 400, and the app's handlers that turn them (and Starlette's own 404 / 405) into responses."""
from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from spot.errors import SpotError
from spot.serve.openai_api import error_body, shown


class HTTPError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.message, self.kind, self.param, self.code), status_code=self.status)


# the library's parameters (spot.errors.PARAMETER) -> the request field that sets each; the others are the server's
# own options (its operator's: --sampler, --device, ...), named in the library's words
REQUEST_FIELDS = {"nodes": "budget", "depth": "depth", "max_new_tokens": "max_tokens", "mode": "mode",
                  "top_k": "top_k", "top_p": "top_p"}


def as_field(parameter: str, value: str | None) -> str | None:
    """A library parameter (and the value the error names) as a request's JSON gives it: `depth=4` -> "depth": 4;
    None for a name that is no request field."""
    field = REQUEST_FIELDS.get(parameter)
    if field is None or value is None:
        return field
    return f'"{field}": {value}'


def spot_error(e: SpotError) -> HTTPError:
    """A user's error (the library's message and hint, its parameters named as request fields) as a 400."""
    e = e.renamed(as_field)
    return HTTPError(400, e.message + (f" (hint: {e.hint})" if e.hint else ""))


def unknown_model(name, served: str) -> HTTPError:
    return HTTPError(404, f"the model {shown(name)} is not served here; this server serves {served!r} "
                          "(GET /v1/models)", param="model", code="model_not_found")


def failure(error: BaseException) -> HTTPError:
    """A decode's error as its request hears it: a user's error (400), or the engine's failure (500)."""
    if isinstance(error, SpotError):
        return spot_error(error)
    return HTTPError(500, f"decoding failed: {type(error).__name__}: {error}", "server_error")


async def http_error(_request: Request, e: HTTPError) -> JSONResponse:
    return e.response()


async def starlette_error(_request: Request, e: HTTPException) -> JSONResponse:
    """An unknown path (404), a wrong method (405): OpenAI's error shape too."""
    return JSONResponse(error_body(str(e.detail), code="_".join(str(e.detail).lower().split())),
                        status_code=e.status_code, headers=e.headers)

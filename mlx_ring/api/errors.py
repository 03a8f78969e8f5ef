"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`, 400 (never 422) for
a bad request, with the field named."""

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param=None,
        code=None,
        headers=None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status,
            message,
            type,
            param,
            code,
        )
        self.headers = headers


def error_body(message: str, type: str, param=None, code=None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def validation_message(errors: list[dict]) -> dict:
    """The 400's {"message", "param"} for the first validation error (pydantic's dicts): one is
    reported, whatever the count, so that no body costs more than one error's text."""
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    msg = first.get("msg", "invalid request").removeprefix("Value error, ")
    param = loc[0] if loc else None
    if param is None and ": " in msg:  # model-level checks name their field as "field: why"
        param = msg.split(": ", 1)[0]
    if first.get("type") == "json_invalid":
        msg, param, loc = "the request body is not valid JSON", None, []
    elif first.get("type") in ("model_attributes_type", "dict_type", "model_type") and not loc:
        msg = "the request body must be a JSON object"
    text = f"{'.'.join(loc)}: {msg}" if loc else msg
    return {"message": text, "param": param}


def validation_error(exc: RequestValidationError) -> JSONResponse:
    out = validation_message(exc.errors()[:1])
    return JSONResponse(
        error_body(out["message"], "invalid_request_error", out["param"]), status_code=400
    )


def api_error(_, exc: ApiError) -> JSONResponse:
    return JSONResponse(
        error_body(exc.message, exc.type, exc.param, exc.code),
        status_code=exc.status,
        headers=exc.headers,
    )


def http_error(_, exc: HTTPException) -> JSONResponse:
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse(
        error_body(str(exc.detail), kind),
        status_code=exc.status_code,
        headers=getattr(exc, "headers", None),
    )


def answer_errors_as_openai(app: FastAPI) -> None:
    """Every error the app answers, in OpenAI's shape: bad requests, refusals, unknown paths."""
    app.add_exception_handler(RequestValidationError, lambda _, exc: validation_error(exc))
    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(HTTPException, http_error)


ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}

"""Request bodies read into the typed models without jamming the event loop: parsing and validating
hold the GIL (Python's json and pydantic-core release it nowhere), so a body of more than a few
hundred KiB is read in a worker process; smaller ones take well under a millisecond, in place.
Only the first problem is reported; lists stop at their first bad item (schema.py, fail_fast)."""

import asyncio
import json
import multiprocessing
import re
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from pydantic import BaseModel, ValidationError

from mlx_ring.api.errors import ApiError, validation_message

# bodies up to this are parsed on the event loop: short enough not to stall it
IN_PLACE_BYTES = 256 * 1024
WORKERS = 2
# a \uD800-\uDFFF escape: json.loads may make a lone surrogate of it
LONE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def read_body(model: type[BaseModel], raw: bytes) -> BaseModel | dict:
    """The request, or the 400's error fields {"message", "param"}; runs in a worker process too."""
    try:
        data = json.loads(raw) if raw else None
    except (ValueError, RecursionError):  # RecursionError: thousands of nested brackets
        return {"message": "the request body is not valid JSON", "param": None}
    if not isinstance(data, dict):
        return {"message": "the request body must be a JSON object", "param": None}
    try:
        # only a \uD800-\uDFFF escape can make one: most bodies skip the re-encoding
        if LONE_SURROGATE.search(raw):
            json.dumps(data, ensure_ascii=False).encode()
    except UnicodeEncodeError as e:  # a lone \udXXX escape: no tokenizer can take it
        return {
            "message": "the request body has a lone UTF-16 surrogate "
            f"({e.object[e.start]!a}) in a string, which is not Unicode text; send each surrogate "
            "in its pair, or the character itself",
            "param": None,
        }
    try:
        return model.model_validate(data)
    except ValidationError as e:
        return validation_message(
            e.errors(include_url=False, include_context=False, include_input=False)[:1]
        )
    except RecursionError:
        return {"message": "the request body is nested too deeply", "param": None}


class Bodies:
    """Reads bodies for the routes: in place when small, else in a pool of worker processes
    (started at the first large body; spawned from the HTTP process, whose main module,
    api/process.py, imports little at its top and no MLX)."""

    def __init__(self):
        self.pool: ProcessPoolExecutor | None = None

    async def read(self, model: type[BaseModel], raw: bytes) -> BaseModel:
        if len(raw) <= IN_PLACE_BYTES:
            out = read_body(model, raw)
        else:
            if self.pool is None:
                self.pool = ProcessPoolExecutor(
                    WORKERS, mp_context=multiprocessing.get_context("spawn")
                )
            try:
                out = await asyncio.get_running_loop().run_in_executor(
                    self.pool, read_body, model, raw
                )
            # a worker was killed (out of memory, say): a new pool for the next body
            except BrokenProcessPool:
                self.pool = None
                raise ApiError(
                    503,
                    "the server could not read this body (its reader process died); retry",
                    "server_error",
                    headers={"Retry-After": "1"},
                ) from None
        if isinstance(out, dict):
            raise ApiError(400, out["message"], param=out["param"])
        return out

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)

"""The OpenAI routes: read a request's body off the event loop when large (bodies.py), check it
against the served model, tokenize it off the event loop, and hand it to `Answers`, which queues it
for the engine and turns the engine's events into OpenAI's responses. No MLX here."""

from fastapi import APIRouter
from fastapi import Request as HttpRequest

from mlx_ring.api.answers import Answers
from mlx_ring.api.bodies import Bodies
from mlx_ring.api.chat import tool_calls
from mlx_ring.api.errors import ERROR_SCHEMA
from mlx_ring.api.prompts import Prompts
from mlx_ring.api.schema import ChatCompletionRequest, CompletionRequest
from mlx_ring.api.served import ServedModel, check_model, check_sampling


def body_of(model) -> dict:
    """The OpenAPI request body of a route that reads `model` itself (openapi.py adds its schema)."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def openai_routes(served: ServedModel, prompts: Prompts, answers: Answers, bodies: Bodies) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/chat/completions", openapi_extra=body_of(ChatCompletionRequest))
    async def chat_completions(http: HttpRequest):
        body = await bodies.read(ChatCompletionRequest, await http.body())
        check_model(served, body.model)
        check_sampling(served, body)
        tools = tool_calls(served, body)
        prompt, grammar = await prompts.chat(body)
        return await answers.respond(body, prompt, http, chat=True, grammar=grammar, tools=tools)

    @router.post("/v1/completions", openapi_extra=body_of(CompletionRequest))
    async def completions(http: HttpRequest):
        body = await bodies.read(CompletionRequest, await http.body())
        check_model(served, body.model)
        check_sampling(served, body)
        prompt = await prompts.completion(body)
        return await answers.respond(body, prompt, http, chat=False)

    def model_card(name: str) -> dict:
        return {"id": name, "object": "model", "created": 0, "owned_by": "mlx-ring"}

    @router.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card(name) for name in served.names()]}

    unknown = {404: {"description": "Unknown model", "content": {"application/json": {"schema": ERROR_SCHEMA}}}}

    @router.get("/v1/models/{model_id:path}", responses=unknown)
    async def model(model_id: str):
        check_model(served, model_id)  # any name the model answers to, an alias's pattern included
        return model_card(served.id if model_id == "default" else model_id)

    return router

"""The OpenAI routes: check a request against the served model, tokenize it off the event loop, and
hand it to `Answers`, which queues it for the engine and turns the engine's events into OpenAI's
responses. No MLX here."""

from fastapi import APIRouter
from fastapi import Request as HttpRequest

from mlx_ring.api.answers import Answers
from mlx_ring.api.chat import tool_calls
from mlx_ring.api.prompts import Prompts
from mlx_ring.api.schema import ChatCompletionRequest, CompletionRequest
from mlx_ring.api.served import ServedModel, check_model, check_sampling


def openai_routes(served: ServedModel, prompts: Prompts, answers: Answers) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, http: HttpRequest):
        check_model(served, body.model)
        check_sampling(served, body)
        tools = tool_calls(served, body)
        prompt, grammar = await prompts.chat(body)
        return await answers.respond(body, prompt, http, chat=True, grammar=grammar, tools=tools)

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest, http: HttpRequest):
        check_model(served, body.model)
        check_sampling(served, body)
        prompt = await prompts.completion(body)
        return await answers.respond(body, prompt, http, chat=False)

    @router.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served.id, "object": "model", "created": 0, "owned_by": "mlx-ring"}]}

    return router

"""The OpenAPI document of the API, as it really answers (schemathesis checks it)."""

from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema

from mlx_ring.api.errors import ERROR_SCHEMA
from mlx_ring.api.schema import ids_below
from mlx_ring.api.served import ServedModel

# the bodies routes read themselves (bodies.py), by schema name
READ_BY_ROUTES: dict[str, type] = {}


def body_of(model) -> dict:
    """The OpenAPI request body of a route that reads `model` itself (bodies.py);
    `document` adds its schema."""
    READ_BY_ROUTES[model.__name__] = model
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def document(app, served: ServedModel) -> dict:
    """The app's OpenAPI schema with what only this server knows: 400 in OpenAI's
    shape, SSE, run-time limits."""
    # FastAPI documents validation failures as 422; this server answers 400 in OpenAI's shape.
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title, version="1", description=app.description, routes=app.routes
        )
        schemas = schema.setdefault("components", {}).setdefault("schemas", {})
        read = {
            op["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
            for ops in schema["paths"].values()
            for op in ops.values()
            if "requestBody" in op
        }
        # the routes read these bodies themselves; together, so that pydantic names apart the
        # dialects' models of one name (anthropic's Message, ollama's Message)
        models = [(READ_BY_ROUTES[name], "validation") for name in sorted(read)]
        refs, doc = models_json_schema(models, ref_template="#/components/schemas/{model}")
        schemas.update(doc.get("$defs", {}))
        for (model, _), ref in refs.items():
            name = ref["$ref"].rsplit("/", 1)[1]
            # a top-level body keeps the name its route's requestBody names
            if name != model.__name__:
                schemas[model.__name__] = schemas.pop(name)
        error = {
            "description": "Bad request, in OpenAI's error shape",
            "content": {"application/json": {"schema": ERROR_SCHEMA}},
        }
        for ops in schema["paths"].values():
            for op in ops.values():
                responses = op.setdefault("responses", {})
                responses.pop("422", None)
                if "requestBody" in op:
                    ok = responses.setdefault("200", {"description": "OK"}).setdefault(
                        "content", {}
                    )
                    # with "stream": true: server-sent events whose data is a JSON chunk or [DONE]
                    ok["text/event-stream"] = {
                        "schema": {"type": "object", "properties": {"data": {"type": "string"}}}
                    }
                    # a dialect's routes document their own error shape (dialects.dialect_router)
                    responses.setdefault("400", error)
                    responses.setdefault("404", error | {"description": "Unknown model"})
                    responses.setdefault(
                        "503", error | {"description": "Busy, draining or the ring is down"}
                    )
                if op.get("operationId", "").startswith(("health", "cluster")):
                    responses["503"] = {"description": "The ring does not answer"}
        # Limits known only at run time: completion length, and token ids of this vocabulary.
        for name, prop in (
            ("ChatCompletionRequest", "max_tokens"),
            ("ChatCompletionRequest", "max_completion_tokens"),
            ("CompletionRequest", "max_tokens"),
        ):
            for branch in schemas[name]["properties"][prop].get(
                "anyOf", [schemas[name]["properties"][prop]]
            ):
                if branch.get("type") == "integer":
                    branch["maximum"] = served.max_tokens_limit or served.context_length
        for branch in schemas["CompletionRequest"]["properties"]["prompt"]["anyOf"]:
            if branch.get("type") == "array":
                branch["items"]["maximum"] = served.vocab_size - 1
        for name in read:  # the served name, so that generated requests reach past the model check
            if "model" in schemas[name]["properties"]:
                schemas[name]["properties"]["model"]["examples"] = [served.id]
        # every dialect's top_k: keeping the whole vocabulary is refused (check_sampling)
        for doc in schemas.values():
            top_k = doc.get("properties", {}).get("top_k", {})
            for branch in top_k.get("anyOf", [top_k] if top_k else []):
                if branch.get("type") == "integer":
                    branch["maximum"] = served.vocab_size - 1
        for name in ("ChatCompletionRequest", "CompletionRequest"):
            props = schemas[name]["properties"]
            for branch in props["logit_bias"].get("anyOf", [props["logit_bias"]]):
                if branch.get("type") == "object":  # keys: token ids below the vocabulary's size
                    branch["patternProperties"] = {
                        ids_below(served.vocab_size): branch["patternProperties"].popitem()[1]
                    }
        # a model without tools: no such fields
        if not getattr(served.tokenizer, "has_tool_calling", False):
            for name in read:
                for field in ("tools", "tool_choice"):
                    schemas[name]["properties"].pop(field, None)
            # a client's search loads only hosted tools, which are not offered
            if "ToolSearchOutput" in schemas:
                schemas["ToolSearchOutput"]["properties"]["tools"]["items"] = {
                    "$ref": "#/components/schemas/WebSearchTool"
                }
        app.openapi_schema = schema
    return app.openapi_schema

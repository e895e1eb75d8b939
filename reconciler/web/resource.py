"""The agents' routes the listener holds besides the MCP endpoints: RFC 9728 metadata and the files endpoint's mount.

`/.well-known/oauth-protected-resource/mcp/<profile>` answers the protected-resource metadata of a profile's MCP
endpoint when org.toml names an identity provider (`[http.auth]`), naming it as the authorization server, so an
OAuth-capable host can run its own sign-in; with the service's tokens alone it is 404, since the document must name
an authorization server and a discovery flow that cannot succeed is worse than none (`governance.credentials`).
`/files/...` goes to the ASGI app `app.Service` hands in (`router/transfer.py`), which the web room never imports.
`http.build_app` adds these routes.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp

from reconciler.governance.credentials import Credentials

__all__ = ["agents_routes"]


def agents_routes(credentials: Credentials | None, files: ASGIApp | None) -> list[BaseRoute]:
    """The metadata route (with `credentials`) and `/files/` (with `files`)."""
    routes: list[BaseRoute] = []
    if credentials is not None:

        async def metadata(request: Request) -> Response:
            profile = request.path_params["profile"]
            document = credentials.resource_metadata(profile, f"{request.url.scheme}://{request.url.netloc}")
            if document is None:
                return PlainTextResponse("No authorization server is configured: this service's MCP endpoints take "
                                         "the tokens its operator makes (handler token create PROFILE).\n",
                                         status_code=404)
            return JSONResponse(document, headers={"Cache-Control": "max-age=300"})

        routes.append(Route("/.well-known/oauth-protected-resource/mcp/{profile}", metadata, methods=["GET"]))
    if files is not None:
        routes.append(Route("/files/{path:path}", files))  # an ASGI app: every method reaches it, path unchanged
    return routes

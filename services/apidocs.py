"""Every service's interactive API documentation at `GET /docs`, offline: FastAPI's default page loads Swagger UI
from a CDN (and ReDoc's from another), which a data centre's private network or an air-gapped laptop cannot
reach. Here the page loads Swagger UI's script and style from the service itself, taken from the `swagger-ui-py`
package's copy of Swagger UI 5 (which reads OpenAPI 3.1, the version FastAPI writes). ReDoc is not served."""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response

ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon-32x32.png": "image/png",
}
PREFIX = "/docs/assets"


def _asset(name: str) -> bytes:
    return resources.files("swagger_ui").joinpath("static", name).read_bytes()


def serve_docs_offline(app: FastAPI) -> None:
    """Replace the app's `/docs` (and drop `/redoc`) by a Swagger UI page whose assets the app serves itself. The
    app must have been made with `docs_url=None, redoc_url=None`, or have its default routes removed here."""
    app.router.routes = [r for r in app.router.routes if getattr(r, "path", None) not in ("/docs", "/redoc")]
    app.docs_url = app.redoc_url = None

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title}: API",
            swagger_js_url=f"{PREFIX}/swagger-ui-bundle.js",
            swagger_css_url=f"{PREFIX}/swagger-ui.css",
            swagger_favicon_url=f"{PREFIX}/favicon-32x32.png",
        )

    @app.get(PREFIX + "/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        if name not in ASSETS:
            return Response(status_code=404)
        return Response(_asset(name), media_type=ASSETS[name], headers={"Cache-Control": "max-age=3600"})

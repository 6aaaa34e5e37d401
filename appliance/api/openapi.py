"""`/schema/openapi.json`: Litestar's document for paths and parameters, completed with what our
handlers declare in `opt` (request body struct, response data struct, success status, error
codes), because bodies are decoded by msgspec inside the handlers for exact error messages."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Router
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.routes import HTTPRoute

from appliance.errors import ERRORS_BY_STATUS, JSON

REF = "#/components/schemas/{name}"
ERROR_STATUS = {cls.code: cls.status for cls in ERRORS_BY_STATUS.values()} | {"INTERNAL_ERROR": 500}
_ERROR_ENVELOPE = {
    "type": "object",
    "required": ["success", "error"],
    "properties": {
        "success": {"const": False},
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "details": {"type": "array", "items": {"type": "string"}},
            },
        },
    },
}
_REQUEST_ID = {"X-Request-Id": {"schema": {"type": "string"}, "description": "Id of this request in the logs"}}


def _envelope(data_schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["success", "data"],
        "properties": {"success": {"const": True}, "data": data_schema},
    }


def build_document(app: Any) -> dict[str, Any]:
    doc = app.openapi_schema.to_schema()
    operations = []
    types: list[Any] = []
    for route in app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        for handler in route.route_handlers:
            if not handler.resolve_include_in_schema():
                continue
            for method in handler.http_methods:
                operations.append((route.path_format, method.lower(), handler.opt))
                types.extend(t for t in (handler.opt.get("body"), handler.opt.get("data")) if t is not None)
    schemas, components = msgspec.json.schema_components(types, ref_template=REF)
    schema_of = dict(zip(types, schemas))
    doc.setdefault("components", {}).setdefault("schemas", {}).update(components)
    doc["components"]["schemas"]["Error"] = _ERROR_ENVELOPE
    doc["components"]["securitySchemes"] = {"apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"}}

    for path, method, opt in operations:
        operation = doc["paths"].get(path, {}).get(method)
        if operation is None:
            continue
        if "body" in opt:
            operation["requestBody"] = {
                "required": not opt.get("body_optional", False),
                "content": {JSON: {"schema": schema_of[opt["body"]]}},
            }
        data_schema = schema_of[opt["data"]] if "data" in opt else {}
        status = str(opt.get("status", 200))
        responses = {status: {"description": "Success", "headers": _REQUEST_ID,
                              "content": {JSON: {"schema": _envelope(data_schema)}}}}
        codes = list(opt.get("errors", ()))
        if not opt.get("public"):
            codes.append("UNAUTHORIZED")
            operation["security"] = [{"apiKey": []}]
            codes.append("RATE_LIMITED")
        if "body" in opt:
            codes += ["VALIDATION_ERROR", "PAYLOAD_TOO_LARGE", "UNSUPPORTED_MEDIA_TYPE"]
        for code in dict.fromkeys(codes + ["INTERNAL_ERROR"]):
            entry = responses.setdefault(str(ERROR_STATUS[code]), {"description": "", "headers": dict(_REQUEST_ID),
                                                                     "content": {JSON: {"schema": {"$ref": REF.format(name="Error")}}}})
            entry["description"] = ", ".join(filter(None, [entry["description"], code]))
            if code == "RATE_LIMITED":
                entry["headers"]["Retry-After"] = {"schema": {"type": "integer"}}
        operation["responses"] = responses
    return doc


class CompletedOpenApiJson(JsonRenderPlugin):
    """Serves /schema/openapi.json (and /schema/) from the completed document, built once."""

    def __init__(self) -> None:
        super().__init__(path="/openapi.json", media_type=JSON)
        self._cached: bytes | None = None

    def render(self, request: Request, openapi_schema: dict[str, Any]) -> bytes:
        if self._cached is None:
            self._cached = msgspec.json.encode(build_document(request.app))
        return self._cached


def openapi_config(title: str, version: str) -> OpenAPIConfig:
    return OpenAPIConfig(
        title=title,
        version=version,
        render_plugins=[CompletedOpenApiJson()],
        openapi_router=Router("/schema", route_handlers=[], opt={"public": True}, include_in_schema=False),
    )

"""The served OpenAPI document and everything else under /schema: every array schema says what
its items are (client generators drop whole models and operations otherwise), the document is
valid OpenAPI 3.1, the Swagger UI reference page works offline (every asset it names is ours and
answers 200), and any other /schema/<name> answers the API's JSON 404 envelope."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

import msgspec
import pytest

from appliance.api import openapi

NOT_FOUND = {"success": False, "error": {"code": "NOT_FOUND", "message": "Resource not found"}}
DATA_KEYWORDS = ("const", "default", "enum", "example", "examples")
NAMED_SCHEMAS = ("properties", "patternProperties", "$defs", "definitions", "schemas")


def walk_schemas(node: Any, path: str = "#") -> list[tuple[str, dict]]:
    """(JSON pointer, schema) of every dict with a "type" anywhere in the document, data
    keywords (examples, defaults, enums) aside."""
    found = []
    if isinstance(node, dict):
        if "type" in node and not isinstance(node["type"], dict):
            found.append((path, node))
        for key, child in node.items():
            if key in NAMED_SCHEMAS and isinstance(child, dict):
                for name, schema in child.items():
                    found += walk_schemas(schema, f"{path}/{key}/{name}")
            elif key not in DATA_KEYWORDS:
                found += walk_schemas(child, f"{path}/{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            found += walk_schemas(child, f"{path}/{i}")
    return found


def is_array(schema: dict) -> bool:
    kind = schema["type"]
    return kind == "array" or (isinstance(kind, list) and "array" in kind)


@pytest.fixture
def doc(client) -> dict:
    response = client.get("/schema/openapi.json")
    assert response.status_code == 200
    return response.json()


# ---- arrays ---------------------------------------------------------------------------------------

def test_every_array_schema_of_the_served_document_has_items(doc):
    arrays = [(path, schema) for path, schema in walk_schemas(doc) if is_array(schema)]
    assert len(arrays) > 20  # the walk reaches components, bodies, responses and parameters
    assert any(path.startswith("#/components/schemas/") for path, _ in arrays)
    assert [(path, schema) for path, schema in arrays if "items" not in schema] == []


def test_submission_actions_are_arrays_of_any_json_value(doc):
    """The field that used to lose its `items` (msgspec's `list[Any]`)."""
    schemas = doc["components"]["schemas"]
    for name in ("Submission", "SubmissionPatch"):
        actions = schemas[name]["properties"]["firstSubmissionActions"]
        assert actions["type"] == "array" and actions["items"] == {}
    assert schemas["SubmissionPatch"]["properties"]["firstSubmissionActions"]["maxItems"] == 100


@pytest.mark.parametrize("annotation", [list, list[Any], tuple, tuple[Any, ...], set, frozenset[Any],
                                        tuple[()], dict[str, list[Any]], list[list[Any]],
                                        list[Any] | None, tuple[int, str]])
def test_item_less_arrays_from_msgspec_are_completed(annotation):
    """msgspec omits `items` whenever the element type is Any (and for the empty tuple); the
    document completes each of those, nested or not, and leaves real item schemas alone."""
    (schema,), components = msgspec.json.schema_components([annotation])
    document = {"schema": schema, "components": components}
    openapi._complete_arrays(document)
    arrays = [s for _, s in walk_schemas(document) if is_array(s)]
    assert arrays and all("items" in s for s in arrays)
    for array in arrays:
        if "prefixItems" in array:
            assert array["items"] is False  # a fixed tuple allows nothing beyond its items
    if annotation == tuple[int, str]:
        assert schema["prefixItems"] == [{"type": "integer"}, {"type": "string"}]


def test_arrays_inside_examples_and_defaults_are_data_not_schemas():
    document = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"},
                                                          "default": [], "examples": [{"type": "array"}]},
                                                 "default": {"type": "array"}, "enum": {"type": "array"}},
                "default": {"type": "array"}}
    openapi._complete_arrays(document)
    assert document["default"] == {"type": "array"}
    assert document["properties"]["tags"]["examples"] == [{"type": "array"}]
    # ...but properties that happen to be called "default" or "enum" are schemas
    assert document["properties"]["default"] == document["properties"]["enum"] == {"type": "array", "items": {}}


# ---- what a reader sees ---------------------------------------------------------------------------

def test_every_operation_has_a_summary_a_description_and_a_declared_tag(doc):
    declared = {tag["name"]: tag.get("description", "") for tag in doc.get("tags", ())}
    assert declared and all(description.strip() for description in declared.values()), declared
    operations = [(f"{method.upper()} {path}", operation) for path, item in doc["paths"].items()
                  for method, operation in item.items()]
    assert len(operations) > 40
    undocumented = [name for name, operation in operations
                    if not operation.get("summary", "").strip() or not operation.get("description", "").strip()]
    assert undocumented == []
    untagged = [name for name, operation in operations
                if not operation.get("tags") or not set(operation["tags"]) <= set(declared)]
    assert untagged == []
    # and every declared group holds something
    assert set(declared) == {tag for _, operation in operations for tag in operation["tags"]}


def test_every_401_documents_its_challenge(doc):
    keyed = [operation for item in doc["paths"].values() for operation in item.values() if operation.get("security")]
    assert len(keyed) >= 40  # every operation but /healthz
    answers = [operation["responses"]["401"] for operation in keyed]
    assert all(answer["headers"]["WWW-Authenticate"]["schema"]["const"]
               == 'APIKey realm="appliance", header="X-API-Key"' for answer in answers)


# ---- validity -------------------------------------------------------------------------------------

def test_the_document_is_valid_openapi_3_1(doc):
    assert doc["openapi"].startswith("3.1")
    try:  # schemathesis (a test dependency) carries the OpenAPI 3.1 meta-schema
        import jsonschema_rs
        from schemathesis.specs.openapi.definitions import OPENAPI_31_VALIDATOR
    except ImportError:  # pragma: no cover
        pytest.skip("no OpenAPI 3.1 validator installed")
    assert [error.message for error in OPENAPI_31_VALIDATOR.iter_errors(doc)] == []
    # that meta-schema does not look inside schema objects: each is checked against JSON Schema
    # 2020-12 (the dialect of OpenAPI 3.1) on its own
    schemas = list(doc["components"]["schemas"].items())
    for operations in doc["paths"].values():
        for operation in operations.values():
            for parameter in operation.get("parameters", ()):
                schemas.append((parameter["name"], parameter["schema"]))
            for media in operation.get("requestBody", {}).get("content", {}).values():
                schemas.append((operation["operationId"] + " body", media["schema"]))
            for status, response in operation["responses"].items():
                for media in response.get("content", {}).values():
                    schemas.append((f"{operation['operationId']} {status}", media["schema"]))
    assert len(schemas) > 100
    assert [name for name, schema in schemas if not jsonschema_rs.meta.is_valid(schema)] == []


def test_every_reference_resolves(doc):
    text = msgspec.json.encode(doc).decode()
    refs = set(re.findall(r'"\$ref":"([^"]+)"', text))
    assert refs
    for ref in refs:
        node: Any = doc
        assert ref.startswith("#/"), ref
        for part in ref[2:].split("/"):
            assert part in node, ref
            node = node[part]


# ---- /schema/swagger ------------------------------------------------------------------------------

class _Assets(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href") and value is not None:
                self.urls.append(value)


def test_the_reference_page_works_offline(client):
    page = client.get("/schema/swagger")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["x-request-id"]
    html = page.text
    assert "SwaggerUIBundle(" in html and 'id="swagger-ui"' in html
    assert "//" not in html.replace("<!--", "")  # no absolute URL of any scheme, nor protocol-relative
    parser = _Assets()
    parser.feed(html)
    # the stylesheet, the script and the icon, plus the document the script loads
    urls = [*parser.urls, *re.findall(r'url: "([^"]+)"', html)]
    assert len(urls) == 4 and "/schema/openapi.json" in urls
    expected_types = {".js": "text/javascript", ".css": "text/css", ".png": "image/png", ".json": "application/json"}
    for url in urls:
        assert url.startswith("/schema/"), url
        asset = client.get(url)
        assert asset.status_code == 200, url
        assert asset.headers["content-type"].startswith(expected_types[url[url.rindex("."):]]), url
        assert len(asset.content) > 500, url
    assert client.get("/schema/swagger/swagger-ui-bundle.js").content.startswith(b"/*!")  # Swagger UI itself


def test_the_reference_page_needs_no_key(client):
    for url in ("/schema/swagger", "/schema/swagger/swagger-ui.css", "/schema/openapi.json"):
        assert client.get(url, headers={"X-API-Key": "wrong"}).status_code == 200


@pytest.mark.parametrize("path", ["/schema/whatever", "/schema/redoc", "/schema/elements", "/schema/rapidoc",
                                  "/schema/openapi.yaml", "/schema/openapi.yml", "/schema/other.json",
                                  "/schema/oauth2-redirect.html", "/schema/swagger/index.html",
                                  "/schema/swagger/swagger-ui.js", "/schema/a/b/c"])
def test_any_other_schema_path_answers_the_json_404_envelope(client, path):
    response = client.get(path)
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("application/json")
    assert response.json() == NOT_FOUND
    assert response.headers["x-request-id"]

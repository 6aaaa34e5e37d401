"""Questionnaires and the field library."""

from __future__ import annotations

from typing import Annotated

import msgspec
from litestar import Request, Response, get
from litestar.params import PathParameter, QueryParameter

from appliance.api.auth import principal
from appliance.api.io import ok_raw, query_bool, query_str
from appliance.api.schemas import FieldList, QuestionnairePage
from appliance.domain.catalog import FieldLibraryEntry
from appliance.errors import NotFound
from appliance.storage import QUESTIONNAIRES

Query = Annotated[str | None, QueryParameter()]
CATEGORIES = ("question", "file", "system", "contact", "attribution", "compliance", "flags", "custom")
TAGS = ["Catalog"]  # this module's group in the OpenAPI document


@get("/api/v1/questionnaires", operation_id="listQuestionnaires",
     summary="List questionnaires", tags=TAGS,
     description="Every questionnaire of the tenant with its questions, in one page.",
     sync_to_thread=False,
     opt={"data": QuestionnairePage})
def questionnaires_list(request: Request) -> Response:
    docs = request.app.state.runtime.store.reader().catalog.list_docs(QUESTIONNAIRES, principal(request.scope).tenant_id)
    pagination = msgspec.json.encode({"total": len(docs), "page": 1, "limit": len(docs)})
    return ok_raw(b'{"questionnaires":[' + b",".join(docs) + b'],"pagination":' + pagination + b"}")


@get("/api/v1/field-library", operation_id="listFieldLibrary",
     summary="List the field library", tags=TAGS,
     description=("The fields the tenant's leads may carry (the standard ones and those its bundles add) with their"
                  " validation rules, filtered by category, active or text."),
     sync_to_thread=False, opt={"data": FieldList})
def field_library_list(
    request: Request, category: Query = None, active: Query = None, search: Query = None
) -> Response:
    docs = request.app.state.runtime.store.reader().catalog.list_fields(principal(request.scope).tenant_id,
        category=query_str(request, "category", choices=CATEGORIES),
        active=query_bool(request, "active"),
        search=search or None,
    )
    return ok_raw(b'{"fields":[' + b",".join(docs) + b"]}")


@get("/api/v1/field-library/{key:str}", operation_id="getFieldLibraryEntry",
     summary="Get a field library entry", tags=TAGS,
     description="One field by its key, such as `address.state`; 404 NOT_FOUND when the tenant has no such field.",
     sync_to_thread=False,
     opt={"data": FieldLibraryEntry, "errors": ["NOT_FOUND"]})
def field_library_get(request: Request, key: Annotated[str, PathParameter()]) -> Response:
    doc = request.app.state.runtime.store.reader().catalog.get_field(principal(request.scope).tenant_id, key)
    if doc is None:
        raise NotFound()
    return ok_raw(doc)


ROUTES = [questionnaires_list, field_library_list, field_library_get]

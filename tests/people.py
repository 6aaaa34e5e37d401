"""People for tests: users made through the public surface (POST /api/v1/users with the tenant's
key, the setup link's page) and signed in to the console with email and password."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

PASSWORD = "a long enough test passphrase"
_TOKEN = re.compile(r'name="csrf" value="([^"]+)"')


@dataclass(frozen=True)
class Person:
    user_id: str
    email: str
    password: str = PASSWORD


def csrf_of(html: str) -> str:
    found = _TOKEN.search(html)
    assert found, html[:500]
    return found.group(1)


def setup_path(setup_url: str) -> str:
    return urlsplit(setup_url).path


def choose_password(client, setup_url: str, password: str = PASSWORD) -> None:
    path = setup_path(setup_url)
    form = client.get(path)
    assert form.status_code == 200, form.text[:300]
    done = client.post(path, data={"csrf": csrf_of(form.text), "password": password, "repeat": password},
                       follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"].startswith("/admin/sign-in"), done.text[:300]


def add_person(client, tenant, role: str = "admin", email: str | None = None, **extra: str) -> Person:
    """A user of `tenant` with a password chosen at its setup link (an admin key makes it: any
    role but owner)."""
    email = email or f"{role}.{tenant.tenant_id.lower()}@example.com"
    made = client.post("/api/v1/users", json={"email": email, "name": role.title(), "role": role, **extra},
                       headers=tenant.headers)
    assert made.status_code == 201, made.text
    choose_password(client, made.json()["data"]["setupUrl"])
    return Person(made.json()["data"]["userId"], email)


def sign_in_as(client, person: Person, *, expect_location: str = "/admin") -> str:
    """Signs the client in; returns the session's CSRF token (of the first page when signed in)."""
    token = csrf_of(client.get("/admin/sign-in").text)
    answer = client.post("/admin/sign-in", data={"csrf": token, "email": person.email, "password": person.password},
                         follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == expect_location, answer.text[:500]
    page = client.get(expect_location)
    assert page.status_code == 200
    return csrf_of(page.text)


_made: dict[tuple[int, str, str], Person] = {}


def sign_in(client, tenant, role: str = "admin") -> str:
    """Signs the client in as a person of `tenant` with `role`, made the first time it is asked."""
    key = (id(client), tenant.tenant_id, role)
    if key not in _made:
        _made[key] = add_person(client, tenant, role)
    return sign_in_as(client, _made[key])

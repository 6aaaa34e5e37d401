"""A tenant's own settings: the bundle's `settings` object."""

from __future__ import annotations

from appliance.domain.permissions import STAFF_ROLES
from appliance.model import Model


class TenantOptions(Model):
    require_two_factor: bool = False  # staff must sign in with a TOTP code (enrolling at their next sign-in)


def owes_enrolment(options: TenantOptions, role: str, enrolled: bool) -> bool:
    """Whether a person must turn two-factor on before any page opens: staff of a tenant that
    requires it, not yet enrolled."""
    return options.require_two_factor and role in STAFF_ROLES and not enrolled

"""`roost doctor`'s checks of WhatsApp: the token and number, and the template."""

from __future__ import annotations

import re

from channels.whatsapp.api import GraphClient, GraphError
from channels.whatsapp.platform import WHATSAPP
from daemon.core.checks import Check
from daemon.core.config import Settings


async def doctor_checks(settings: Settings) -> list[Check]:
    """The token and phone number id (and the template, when one is named), as Meta sees them."""
    checks = [await _whatsapp_check(settings)]
    if WHATSAPP.of(settings.platforms).template:
        checks.append(await _template_check(settings))
    return checks


async def _template_check(settings: Settings) -> Check:
    """whatsapp.template exists in its language, is approved, and has the parameters roost
    fills: `GET /{business_account_id}/message_templates?name=`."""
    wa = WHATSAPP.of(settings.platforms)
    name = f"whatsapp template {wa.template}"
    if not wa.business_account_id:
        return Check(name, False, "not checked: whatsapp.business_account_id is not set",
                     "set whatsapp.business_account_id (WhatsApp Manager, Account tools) so "
                     "that doctor can see the template")
    client = GraphClient(wa, timeout=10)
    await client.start()
    try:
        found = await client.templates(wa.business_account_id, wa.template or "")
    except GraphError as exc:
        return Check(name, False, f"the Graph API refused: {exc}",
                     "the token needs whatsapp_business_management to read templates")
    finally:
        await client.close()
    same = [t for t in found if t.get("name") == wa.template
            and t.get("language") == wa.template_language]
    if not same:
        languages = ", ".join(str(t.get("language")) for t in found) or "none"
        return Check(name, False, f"no such template in {wa.template_language} "
                     f"(languages found: {languages})",
                     "create it in WhatsApp Manager, or set whatsapp.template_language")
    template = same[0]
    parts = [c for c in template.get("components") or [] if isinstance(c, dict)]
    body = " ".join(str(c.get("text") or "") for c in parts if c.get("type") == "BODY")
    elsewhere = [c.get("type") for c in parts if c.get("type") != "BODY"
                 and re.search(r"\{\{[^}]+\}\}", str(c.get("text") or ""))]
    if template.get("parameter_format") == "NAMED" or elsewhere:
        return Check(name, False, "it has named parameters or parameters outside its body; "
                     "roost fills one numbered body parameter ({{1}}) at most",
                     "use a template whose body has no parameter or {{1}}")
    wanted, has = int(wa.template_parameter), len(re.findall(r"\{\{\d+\}\}", body))
    if template.get("status") != "APPROVED":
        return Check(name, False, f"status {template.get('status')}: Meta sends only approved "
                     "templates", "wait for Meta's review, or name an approved template")
    if has != wanted:
        return Check(name, False, f"its body has {has} parameters; roost fills {wanted}",
                     "set whatsapp.template_parameter = true for a template with one "
                     "parameter, false for one without" if has <= 1 else
                     "use a template with no parameter or one")
    return Check(name, True, f"approved, {wa.template_language}, {has} parameter(s)")


async def _whatsapp_check(settings: Settings) -> Check:
    """The token is valid for the phone number id: `GET /{phone_number_id}`."""
    client = GraphClient(WHATSAPP.of(settings.platforms), timeout=10)
    await client.start()
    try:
        number = await client.phone_number()
    except GraphError as exc:
        return Check("whatsapp", False, f"the Graph API refused: {exc}",
                     "check ROOST_WHATSAPP_TOKEN (a permanent system-user token with "
                     "whatsapp_business_messaging) and whatsapp.phone_number_id")
    finally:
        await client.close()
    return Check("whatsapp", True, f"number {number.get('display_phone_number', '?')} "
                 f"({number.get('verified_name', 'no verified name')})")

"""`roost init`'s part for WhatsApp: the phone number id, the three secrets (the access token
checked with the Graph API), and the owner's own number, let in by `whatsapp.allow` so that
their own bot does not answer them with a pairing code."""

from __future__ import annotations

import re
import secrets

from channels.whatsapp.api import GraphClient, GraphError
from channels.whatsapp.platform import WhatsAppSettings
from daemon.core.setup import (
    EX_CONFIG,
    EX_UNAVAILABLE,
    TRIES,
    Asker,
    SetUp,
    SetupRequest,
    SetupStop,
    Value,
)

DEFAULT_GRAPH = WhatsAppSettings.api_base
SECRETS = ("ROOST_WHATSAPP_TOKEN", "ROOST_WHATSAPP_APP_SECRET", "ROOST_WHATSAPP_VERIFY_TOKEN")


async def set_up(request: SetupRequest) -> SetUp:
    asker, api_base = request.asker, str(request.options["whatsapp_api_base"])
    phone_number_id, wanted = _number_and_secrets(request)
    owner = _owner(asker, request.options["whatsapp_owner"])
    wanted["ROOST_WHATSAPP_TOKEN"] = await _check(asker, api_base, phone_number_id,
                                                  wanted["ROOST_WHATSAPP_TOKEN"])
    table: dict[str, Value] = {"phone_number_id": phone_number_id}
    if api_base != DEFAULT_GRAPH:
        table["api_base"] = api_base
    if owner:
        table["allow"] = (owner,)
    return SetUp(table, wanted)


def _number_and_secrets(request: SetupRequest) -> tuple[str, dict[str, str]]:
    asker, env = request.asker, request.env
    phone_number_id: str | None = request.options["whatsapp_phone_number_id"]
    if not asker.interactive:
        if not phone_number_id:
            raise SetupStop("WhatsApp needs --whatsapp-phone-number-id", EX_CONFIG)
        missing = [name for name in SECRETS if not env.get(name)]
        if missing:
            raise SetupStop(f"WhatsApp needs {', '.join(missing)} in the environment",
                            EX_CONFIG)
        return phone_number_id, {name: env[name].strip() for name in SECRETS}
    asker.say("WhatsApp needs a Meta app with the WhatsApp product (README: WhatsApp).")
    phone_number_id = phone_number_id or asker.ask("Phone number id (Meta app dashboard)")
    wanted = {"ROOST_WHATSAPP_TOKEN": asker.ask("Permanent access token", hidden=True),
              "ROOST_WHATSAPP_APP_SECRET": asker.ask("App secret", hidden=True),
              "ROOST_WHATSAPP_VERIFY_TOKEN": asker.ask(
                  "Verify token (enter it in Meta's webhook settings)", secrets.token_hex(16))}
    return phone_number_id, wanted


def _owner(asker: Asker, given: str | None) -> str | None:
    """The owner's own WhatsApp number (a wa_id: digits with the country code)."""
    for _ in range(TRIES):
        if given is None and asker.interactive:
            given = asker.ask("Your own WhatsApp number, with its country code (roost "
                              "answers it without pairing; empty: pair later)")
        number = re.sub(r"[\s()+-]", "", given or "")
        if not number or number.isdigit():
            return number or None
        if not asker.interactive:
            raise SetupStop(f"--whatsapp-owner {given!r} is not a phone number (digits with "
                            "the country code, such as 972544401243)", EX_CONFIG)
        asker.say("That is not a phone number: digits with the country code, such as "
                  "+972 54 440 1243")
        given = None
    raise SetupStop("no usable WhatsApp number", 1)


async def _check(asker: Asker, api_base: str, phone_number_id: str, token: str) -> str:
    """The access token that is valid for the number (`GET /{phone_number_id}`, as doctor
    asks); a refused one is asked again (interactive only)."""
    for attempt in range(TRIES):
        client = GraphClient(WhatsAppSettings(enabled=True, phone_number_id=phone_number_id,
                                              api_base=api_base, token=token), timeout=10)
        await client.start()
        try:
            number = await client.phone_number()
        except GraphError as exc:
            if exc.status >= 500:
                raise SetupStop(f"WhatsApp: {exc}", EX_UNAVAILABLE) from None
            if not asker.interactive or attempt == TRIES - 1:
                raise SetupStop(f"the Graph API refused the WhatsApp token for number id "
                                f"{phone_number_id}: {exc}", EX_CONFIG) from None
            asker.say(f"The Graph API refused that token for {phone_number_id}: {exc}")
            token = asker.ask("Permanent access token", hidden=True)
            continue
        finally:
            await client.close()
        asker.say(f"WhatsApp: number {number.get('display_phone_number', '?')} "
                  f"({number.get('verified_name', 'no verified name')})")
        return token
    raise AssertionError("unreachable")

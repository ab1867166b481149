"""PII scrubbing: e-mail addresses and public IP addresses replaced as datatrove's ``PIIFormatter`` does;
phone numbers optionally, by a pattern of ours (datatrove has none).

E-mail and IP: datatrove's regexes, its replacement strings (used in turn), its rule for which IPs go
(``ipaddress.ip_address(match).is_global``: public addresses only; a match that is not a valid address
stays). E-mails are replaced first, then IPs, as there. One difference, on purpose: datatrove's
replacements cycle over every match its process has seen, so what a document becomes depends on the
documents before it in the same task; here the cycle starts again with each document, so a document's
output depends on nothing but itself (shards concatenate to the one-machine output, and the same
document is scrubbed the same way wherever it lies). For one document it is datatrove's output exactly.

Phone (``--pii phone``, after the others): an international number (``+`` and a country code, then 2 to 5
groups of digits separated by a space, dot or dash, an area code in parentheses allowed) or a North
American one (``(415) 555-2671``, ``415-555-2671``, ``415.555.2671``), standing alone (no letter, digit
or ``+`` touching it), of 7 to 15 digits in all (E.164's bound); replaced by :data:`PHONE_REPLACEMENT`, a
number reserved for fiction.
"""

from __future__ import annotations

import ipaddress
import re

from llmtools.errors import UsageError
from llmtools.prep.curate.registry import Param, Rule, register_rule
from llmtools.prep.curate.step import KEEP, Document, Outcome

NAME = "pii"
KINDS = ("email", "ip", "phone")
DEFAULT_KINDS = ("email", "ip")

# datatrove/pipeline/formatters/pii.py (0.10), unchanged
EMAIL = re.compile(
    r"\b[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@(?:(?:[A-Za-z0-9](?:["
    r"A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?|\[(?:(?:25[0-5]|2[0-4][0-9]|["
    r"01]?[0-9][0-9]?)\.){3}(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?|[A-Za-z0-9-]*[A-Za-z0-9]:)])"
)
IP = re.compile(r"(?:(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)\.){3}(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)")
EMAIL_REPLACEMENTS = ("email@example.com", "firstname.lastname@example.org")
IP_REPLACEMENTS = (
    "22.214.171.124",
    "126.96.36.199",
    "188.8.131.52",
    "184.108.40.206",
    "220.127.116.11",
    "18.104.22.168",
)

PHONE = re.compile(
    r"(?<![\w+.])(?:"
    r"\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:[ .-]\d{2,4}){1,4}"
    r"|\(\d{3}\)[ .-]?\d{3}[ .-]\d{4}"
    r"|\d{3}[ .-]\d{3}[ .-]\d{4}"
    r")(?![\w+]|[.-]\d)"
)
PHONE_REPLACEMENT = "+1-202-555-0100"
PHONE_DIGITS = (7, 15)


def public_ip(text: str) -> bool:
    """datatrove's ``public_ip_validator``: a valid address that is globally reachable."""
    try:
        return ipaddress.ip_address(text).is_global
    except ValueError:
        return False


def phone_digits_ok(text: str) -> bool:
    digits = sum(c.isdigit() for c in text)
    return PHONE_DIGITS[0] <= digits <= PHONE_DIGITS[1]


def replace(pattern: re.Pattern, replacements: tuple[str, ...], text: str, valid=None) -> tuple[str, int]:
    """datatrove's ``PIIReplacer.replace`` with its cycle started afresh: (new text, replacements made)."""
    count = 0

    def sub(match: re.Match) -> str:
        nonlocal count
        found = match.group(0)
        if valid is not None and not valid(found):
            return found
        replacement = replacements[count % len(replacements)]
        count += 1
        return replacement

    return pattern.sub(sub, text), count


class PIIFormatter:
    name = NAME

    def __init__(self, kinds: list[str] | None = None) -> None:
        kinds = list(kinds) if kinds else list(DEFAULT_KINDS)
        unknown = [k for k in kinds if k not in KINDS]
        if unknown:
            raise UsageError(f"--pii: {unknown[0]!r} is not one of {', '.join(KINDS)}")
        self.kinds = [k for k in KINDS if k in kinds]  # the stated order, whatever order they were given

    def __call__(self, doc: Document) -> Outcome:
        text, total, counts = doc.text, 0, {}
        for kind in self.kinds:
            if kind == "email":
                text, n = replace(EMAIL, EMAIL_REPLACEMENTS, text)
            elif kind == "ip":
                text, n = replace(IP, IP_REPLACEMENTS, text, public_ip)
            else:
                text, n = replace(PHONE, (PHONE_REPLACEMENT,), text, phone_digits_ok)
            counts[kind] = n
            total += n
        if not total:
            return KEEP
        return Outcome(text=text, changes=total, values=counts)


register_rule(
    Rule(
        NAME,
        PIIFormatter,
        (Param("kinds", list, list(DEFAULT_KINDS), "what to replace: email, ip, phone"),),
        "e-mail and public IP addresses replaced as datatrove's PIIFormatter; phone numbers optionally",
        changes_text=True,
    )
)

"""`format` checkers: jsonschema's (with its format-nongpl extra), corrected where they are wrong.

Why our own for four formats: jsonschema's `email` only looks for an "@"; its `date-time` and
`time` (rfc3339-validator) refuse leap seconds, which RFC 3339 allows at 23:59:60 UTC; its `regex`
is Python's `re`, another dialect than the ECMA-262 JSON Schema names (ecma_regex.py). Each
rule below is the RFC's grammar, cited where it is applied.
"""

from __future__ import annotations

import ipaddress
import re
from functools import cache
from typing import Any

from jsonschema import FormatChecker
from jsonschema.protocols import Validator

from . import ecma_regex

# RFC 3339 §5.6, ASCII digits only (`\d` would take any Unicode digit).
_TIME = re.compile(
    r"([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?(?:(Z)|([+-])([0-9]{2}):([0-9]{2}))", re.IGNORECASE
)
_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
# RFC 5321 §4.1.2 dot-atom local part (atext) and §4.1.3 address literals; RFC 1123 host names.
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_DOT_ATOM = re.compile(rf"{_ATEXT}(?:\.{_ATEXT})*")
_QUOTED = re.compile(r'"(?:[^"\\\r\n]|\\.)*"')
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def is_time(text: str) -> bool:
    """RFC 3339 full-time; a leap second only where it is 23:59:60 in UTC."""
    match = _TIME.fullmatch(text)
    if not match:
        return False
    hour, minute, second = (int(match.group(i)) for i in (1, 2, 3))
    offset = 0
    if match.group(6):
        off_h, off_m = int(match.group(7)), int(match.group(8))
        if off_h > 23 or off_m > 59:
            return False
        offset = (off_h * 60 + off_m) * (1 if match.group(6) == "+" else -1)
    if hour > 23 or minute > 59 or second > 60:
        return False
    if second == 60:
        utc = (hour * 60 + minute - offset) % (24 * 60)
        return utc == 23 * 60 + 59
    return True


def is_date(text: str) -> bool:
    match = _DATE.fullmatch(text)
    if not match:
        return False
    year, month, day = (int(g) for g in match.groups())
    if not 1 <= month <= 12 or day < 1:
        return False
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    return day <= (29 if month == 2 and leap else 28 if month == 2 else _DAYS[month - 1])


def is_date_time(text: str) -> bool:
    date, sep, time = text.partition("T") if "T" in text else text.partition("t")
    return bool(sep) and is_date(date) and is_time(time)


def is_email(text: str, idn: bool = False) -> bool:
    """RFC 5321 mailbox: dot-atom or quoted local part; host name or address literal."""
    local, at, domain = text.rpartition("@")
    if not at or not local or not domain:
        return False
    local_ok = _QUOTED.fullmatch(local) or _DOT_ATOM.fullmatch(local) or (idn and _idn_local(local))
    return bool(local_ok) and _mail_domain(domain, idn)


def _idn_local(local: str) -> bool:
    """RFC 6531 extends atext with any non-ASCII character; dots still separate atoms."""
    atoms = local.split(".")
    return all(atoms) and all(ord(c) > 127 or _DOT_ATOM.fullmatch(c) for atom in atoms for c in atom)


def _mail_domain(domain: str, idn: bool) -> bool:
    if domain.startswith("[") and domain.endswith("]"):
        literal = domain[1:-1]
        try:
            if literal[:5].lower() == "ipv6:":
                ipaddress.IPv6Address(literal[5:])
            else:
                ipaddress.IPv4Address(literal)
        except ValueError:
            return False
        return True
    if idn:
        try:
            domain = domain.encode("idna").decode("ascii")
        except UnicodeError:
            return False
    labels = domain.split(".")
    return len(domain) <= 253 and all(_LABEL.fullmatch(label) for label in labels)


_OURS = {
    "date-time": is_date_time,
    "time": is_time,
    "email": is_email,
    "idn-email": lambda text: is_email(text, idn=True),
    "regex": ecma_regex.is_pattern,
}


@cache
def format_checker(validator_class: type[Validator]) -> FormatChecker:
    """The draft's own checkers (the formats it defines), with ours in place of the wrong ones."""
    base = validator_class.FORMAT_CHECKER
    checker = FormatChecker(formats=())
    checker.checkers = dict(base.checkers)
    for name, check in _OURS.items():
        if name in base.checkers:
            checker.checks(name)(_strings_only(check))
    return checker


def _strings_only(check: Any) -> Any:
    """A format applies to strings; any other instance passes (every draft says so)."""

    def wrapped(instance: object) -> bool:
        return not isinstance(instance, str) or check(instance)

    return wrapped

"""The forms one secret can take once a program has written it down, as one regular expression.

A key reaches text raw, percent-encoded (a URL, once or twice), JSON- or repr-escaped (once or
nested: a JSON body quoted in an exception's repr), HTML-escaped (a report) or base64-encoded
(``Authorization: Basic``, a JWT, a log of raw headers). ``pattern(secret)`` matches it in any
of those forms; every character of the secret other than ASCII letters and digits (which no
encoder escapes) may be written in any of its escapes independently, as encoders escape only
some characters and in their own style. Base64 is
matched at the three byte alignments the secret can have inside a longer encoded string, minus
the edge characters it shares with its neighbours, so ``base64("user:" + key)`` is caught too.
"""

from __future__ import annotations

import base64
import re

# the part of a secret found between delimiters (";", ",", "=", quotes, spaces...): a server or
# a log line may quote only that piece, and non-ASCII characters may be mangled around it
PIECE = re.compile(r"""[^\s"'`,;=&\\<>()\[\]{}|\x7f-\U0010ffff]+""")
_HTML_NAMED = {"&": "amp", "<": "lt", ">": "gt", '"': "quot", "'": "apos"}
_ESCAPED = {"\n": "n", "\t": "t", "\r": "r"}
# The characters escapes are written with, each as written by the next encoder too: a JSON or
# repr escape's backslash percent-encoded (a URL holding a JSON body) or HTML-escaped (a
# report quoting a repr), an HTML escape's "&", "#" and ";" percent-encoded or HTML-escaped
# again. Without them a key whose delimiters were escaped twice, by two encoders, is missed.
_SEMI = r"(?:;|%(?:25)*3[bB])"
_AMP = r"(?:&|%(?:25)*26)(?:amp" + _SEMI + ")*"
_HASH = r"(?:#|%(?:25)*23)"
_BS = r"(?:\\|%(?:25)*5[cC]|" + _AMP + _HASH + "(?:0*92|[xX]0*5[cC])" + _SEMI + ")"


def _hex(n: int, width: int) -> str:
    """``n`` as hexadecimal digits of either case, with optional leading zeros beyond ``width``."""
    return f"(?i:{n:0{width}x})"


def _char(c: str) -> str:
    """Every way ``c`` may have been written by the usual encoders, as a regex group."""
    if c.isascii() and c.isalnum():  # unreserved everywhere: no encoder escapes these
        return c
    utf8 = c.encode("utf-8", "surrogatepass")
    cp = ord(c)
    bs = _BS + "+"  # one backslash per level of escaping
    alts = [re.escape(c),
            "".join(f"%(?:25)*{_hex(b, 2)}" for b in utf8),
            "".join(bs + "x" + _hex(b, 2) for b in utf8),  # bytes repr of the UTF-8
            f"{_AMP}{_HASH}0*{cp}{_SEMI}", f"{_AMP}{_HASH}[xX]0*{_hex(cp, 1)}{_SEMI}"]
    if c == " ":
        alts.append(r"(?:\+|%(?:25)*2[bB])")  # form encoding, then percent-encoded again
    if c in _HTML_NAMED:
        alts.append(f"{_AMP}{_HTML_NAMED[c]}{_SEMI}")
    if c in _ESCAPED:
        alts.append(bs + _ESCAPED[c])
    if cp < 0x100:
        alts.append(bs + "x" + _hex(cp, 2))
    if cp < 0x10000:
        alts.append(bs + "u" + _hex(cp, 4))
    else:  # JSON writes astral characters as a surrogate pair
        hi, lo = 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF)
        alts.append(f"{bs}u{_hex(hi, 4)}{bs}u{_hex(lo, 4)}")
    alts.append(bs + "U" + _hex(cp, 8))
    written = "(?:" + "|".join(alts) + ")"
    # quotes, backslashes and slashes are the characters escaped by a backslash (JSON, repr),
    # once per level of quoting, whatever form the character itself then takes
    return _BS + "*" + written if c in "\"'\\/" else written


def base64_forms(secret: str) -> set[str]:
    """The part of the base64 (standard and URL-safe alphabets) that ``secret`` alone decides,
    at each of the three alignments it can have inside a longer encoded string."""
    raw = secret.encode("utf-8", "surrogatepass")
    out = set()
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).decode().rstrip("=")
        start = -(-offset * 4 // 3)  # the first character no byte before the secret touches
        end = (offset + len(raw)) * 8 // 6  # past the last character only the secret decides
        core = encoded[start:end]
        out |= {core, core.replace("+", "-").replace("/", "_")}
    return out


def pattern(secret: str) -> str:
    """A regex matching ``secret`` written in any mix of the forms above."""
    return "".join(_char(c) for c in secret)


def anchor(secret: str) -> str:
    """The longest run of ASCII letters and digits in ``secret``: every form above writes it
    as it is, so text without it cannot hold the secret (a cheap test before the regex)."""
    runs = re.findall(r"[A-Za-z0-9]+", secret)
    return max(runs, key=len) if runs else ""


def pieces(secret: str, minimum: int) -> set[str]:
    """The runs of ``minimum``+ plain ASCII characters between a secret's delimiters (or the
    stray non-ASCII characters pasted with it), each a secret of its own."""
    return {p for p in PIECE.findall(secret) if len(p) >= minimum and p != secret}


__all__ = ["anchor", "base64_forms", "pattern", "pieces"]

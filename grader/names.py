"""Names and cells the board shows, made so that what a submission controls cannot pass for something else.

A submission's name is its file's name, which its author chose. On the board (terminal, JSON, CSV) it is:

* NFKC-normalised (Unicode Standard Annex #15): compatibility forms read as what they stand for, so a
  full-width `ｈｏｎｅｓｔ` reads `honest`;
* shown with every character that is not printable, is a line break or a space other than ` `, or draws
  nothing (a Hangul or braille filler, a combining mark standing alone) as its backslash escape, so a name
  cannot hold a fake row of the board, move the terminal's cursor or look blank;
* told apart from the names it could pass for: two submissions whose names agree once normalised, or agree
  in every ASCII character at the same places (`honest_ddp` and `hon\u0435st_ddp`, with a Cyrillic `е`),
  show their non-ASCII characters as escapes, so the two never read alike. (Unicode Technical Standard #39
  lists which characters look alike; this rule needs no such table: any same-length substitution of a
  non-ASCII character for an ASCII one, or for another non-ASCII one, is caught.)

A CSV cell of text is neutralised as OWASP's "CSV Injection" advises: a cell that starts with `=`, `+`, `-`,
`@`, a tab, a carriage return or a line feed, or the full-width forms of those signs, or that starts with
one of them once its leading spaces are dropped, is led by a `'`, which a spreadsheet shows as text
(https://owasp.org/www-community/attacks/CSV_Injection).
"""

from __future__ import annotations

import unicodedata
from collections import defaultdict

# Characters that print as nothing though Python calls them printable: Hangul fillers, the braille blank,
# Mongolian vowel separator and variation selectors (Unicode's Default_Ignorable_Code_Point set, in part)
INVISIBLE = frozenset("\u115f\u1160\u3164\uffa0\u2800\u180e\u034f\u17b4\u17b5") \
    | frozenset(chr(c) for c in range(0xFE00, 0xFE10)) | frozenset(chr(c) for c in range(0x180B, 0x1810))
FORMULA_LEADS = frozenset("=+-@\t\r\n\uff1d\uff0b\uff0d\uff20\ufe62\ufe63\u2212")  # and full-width / small forms


def escaped(char: str) -> str:
    """One character as its backslash escape (`\\n`, `\\x1b`, `\\u3164`)."""
    return char.encode("unicode_escape").decode("ascii")


def _drawn(char: str) -> bool:
    return (char.isprintable() and char not in INVISIBLE and (char == " " or not char.isspace())
            and unicodedata.category(char) not in ("Zs", "Mn", "Me"))


def shown_name(name: str, ascii_only: bool = False) -> str:
    """`name` NFKC-normalised, each character that draws nothing (or, with `ascii_only`, each non-ASCII
    one) as its escape; a name that would show as nothing at all is shown all escaped."""
    text = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    original, text = text, unicodedata.normalize("NFKC", text)
    if not any(_drawn(c) and c != " " for c in text):  # (shown as the code points the file name holds)
        return "".join(escaped(c) if c != "\\" else c for c in original) or "(no name)"
    return "".join(c if _drawn(c) and (not ascii_only or c.isascii()) else escaped(c) for c in text)


def _readable(name: str) -> str:
    return unicodedata.normalize("NFKC", name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")).casefold()


def _alike(a: str, b: str) -> bool:
    """Whether two (readable) names could be read as one: of one length, and at every place the same
    character or a non-ASCII one in either."""
    return len(a) == len(b) and all(x == y or not x.isascii() or not y.isascii() for x, y in zip(a, b))


def board_names(names: dict[object, str]) -> dict[object, str]:
    """Each key's name as the board shows it: `shown_name`; but where two names could be read as one
    (`_alike`, whole or in their last `/`-separated part, the file's own name), each of them that holds a
    non-ASCII character is shown as the code points it holds, non-ASCII ones escaped."""
    flagged = set()
    for part in (lambda name: name, lambda name: name.rsplit("/", 1)[-1]):
        readable = {key: _readable(part(name)) for key, name in names.items()}
        by_length: defaultdict[int, list[object]] = defaultdict(list)
        for key, text in readable.items():
            by_length[len(text)].append(key)
        for keys in by_length.values():
            for i, a in enumerate(keys):
                for b in keys[i + 1:]:
                    if part(names[a]) != part(names[b]) and _alike(readable[a], readable[b]):
                        flagged.update((a, b))
    shown = {}
    for key, name in names.items():
        if key in flagged and not name.isascii():
            text = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            shown[key] = "".join(c if c.isascii() and _drawn(c) else escaped(c) for c in text)
        else:
            shown[key] = shown_name(name)
    return shown


def csv_text(text: str) -> str:
    """A CSV cell of text a submission controls, safe to open in a spreadsheet: control characters (line
    breaks but `\\n` inside the text) as escapes, and led by `'` where a spreadsheet would read a formula."""
    first = text.lstrip(" \t\r\n\u00a0\u3000")[:1]
    lead = text[:1] in FORMULA_LEADS or (first != "" and first in FORMULA_LEADS)
    text = "".join(c if c.isprintable() or c == "\n" else escaped(c) for c in text)
    return "'" + text if lead else text

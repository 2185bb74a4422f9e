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
    text = unicodedata.normalize("NFKC", text)
    if not any(_drawn(c) and c != " " for c in text):
        return "".join(escaped(c) if c != "\\" else c for c in text) or "(no name)"
    return "".join(c if _drawn(c) and (not ascii_only or c.isascii()) else escaped(c) for c in text)


def _skeleton(name: str) -> str:
    """What `name` may be read as: normalised, every non-ASCII character one placeholder."""
    return "".join(c if c.isascii() else "\0" for c in unicodedata.normalize("NFKC", name).casefold())


def board_names(names: dict[object, str]) -> dict[object, str]:
    """Each key's name as the board shows it: `shown_name`, and where two names could be read as one
    (`_skeleton`), those holding non-ASCII characters shown with them escaped; a name that still reads as
    another's gets its escaped original form."""
    groups: defaultdict[str, list[object]] = defaultdict(list)
    for key, name in names.items():
        groups[_skeleton(name)].append(key)
    shown = {}
    for keys in groups.values():
        alike = len({names[k] for k in keys}) > 1
        for key in keys:
            shown[key] = shown_name(names[key], ascii_only=alike)
    # a name NFKC makes equal to another's (`ｈonest`, `honest`): its original code points tell them apart
    seen: defaultdict[str, list[object]] = defaultdict(list)
    for key, text in shown.items():
        seen[text].append(key)
    for keys in seen.values():
        if len({names[k] for k in keys}) > 1:
            for key in keys:
                if not names[key].isascii():
                    shown[key] = "".join(c if c.isascii() and _drawn(c) else escaped(c) for c in names[key])
    return shown


def csv_text(text: str) -> str:
    """A CSV cell of text a submission controls, safe to open in a spreadsheet: control characters (line
    breaks but `\\n` inside the text) as escapes, and led by `'` where a spreadsheet would read a formula."""
    first = text.lstrip(" \t\r\n\u00a0\u3000")[:1]
    lead = text[:1] in FORMULA_LEADS or (first != "" and first in FORMULA_LEADS)
    text = "".join(c if c.isprintable() or c == "\n" else escaped(c) for c in text)
    return "'" + text if lead else text

"""Text that quotes what users wrote (a task's stderr tail as its failure reason, a job's name), made safe to print on
one line: line breaks and terminal controls written as escapes, so that such text neither forges a line of a log of
its own nor reaches the terminal of whoever reads it as an escape sequence (a window title, the clipboard)."""

from __future__ import annotations

CONTROLS = str.maketrans(
    {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if c != 0x09}
    | {0x0A: "\\n", 0x0D: "\\r", 0x2028: "\\u2028", 0x2029: "\\u2029"}
)
"""C0 and C1 controls and DEL (but tab), and the Unicode line and paragraph separators, as escapes."""


def printable(text: str) -> str:
    """`text` on one line, its controls escaped (`CONTROLS`)."""
    return text.translate(CONTROLS)

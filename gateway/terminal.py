"""Text a run produced, made fit for a terminal or for plain text.

Whatever a run prints reaches the terminal of whoever runs `gateway run`, and a terminal
obeys escape sequences: a run could set the window title, write to the clipboard (OSC 52),
rewrite the screen, or hide text. `terminal_safe` removes every escape sequence and every
control character but tab, newline and carriage return; `strip_colors` removes only the
colour codes (CSI sequences) that IPython puts in tracebacks, for the plain-text answers of
the tool endpoints and the MCP server.
"""

from __future__ import annotations

import re

__all__ = ["strip_colors", "terminal_safe"]

# CSI: ESC [ parameters intermediates final (also the one-character 8-bit CSI, U+009B).
_CSI = r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
_COLORS = re.compile(_CSI)
_CONTROLS = re.compile(
    "|".join(
        [
            _CSI,
            # OSC, DCS, SOS, PM, APC: a string up to BEL or ST (ESC \ or U+009C), or the end
            r"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f]).*?(?:\x07|\x1b\\|\x9c|\Z)",
            # any other escape sequence: ESC, intermediates, a final character
            r"\x1b[ -/]*[0-~]?",
            # control characters but \t \n \r, DEL and the C1 controls
            r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]",
        ]
    ),
    re.DOTALL,
)


def strip_colors(text: str) -> str:
    """`text` without CSI sequences (colours, cursor moves): IPython's traceback colours."""
    return _COLORS.sub("", text)


def terminal_safe(text: str) -> str:
    """`text` without any escape sequence or control character but tab, newline and
    carriage return: safe to write to a terminal."""
    return _CONTROLS.sub("", text)

"""What differs between the languages a run can be in: the one place for it.

The executor, the session, the outcome and the sandboxes ask these properties instead of
testing a language's name, so a language is added here (its traits, its notebook
metadata, the names a notebook may give it) plus its kernel's command line in
`gateway.sandbox.kernelspec` and the gateway's own code in its language in
`gateway.execution.kernel_code`. Pools are per kernel: one Deno kernel serves JavaScript and
TypeScript.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from typing import Any, Literal

from gateway.models.common import Language

Kernel = Literal["ipykernel", "bash", "deno", "irkernel"]


@dataclasses.dataclass(frozen=True)
class LanguageTraits:
    """How a language's kernel behaves, where the gateway must know it."""

    # the kernel that runs it (its command line: `gateway.sandbox.kernelspec`; the
    # gateway's own code in it: `gateway.execution.kernel_code`)
    kernel: Kernel
    # the global `result` (else `output`) is read back after the last cell
    reads_result: bool
    # the kernel may publish a cell's output after its `idle` status (Deno sends its
    # stdout and stderr from another thread): the session waits for a fence the gateway
    # writes through the same streams once the cell has replied (`execution.fence`)
    fenced_output: bool = False
    # the kernel process ending during a cell is the program ending with that status
    # (`Deno.exit(n)`), not a crash of the kernel
    exit_is_program_exit: bool = False
    # an interrupt stops running code (ipykernel, our bash kernel); otherwise the kernel
    # is killed at the deadline without one (V8 does not stop `while (true) {}`)
    interruptible: bool = True
    # the kernel listens on TCP ports of the sandbox's loopback (`kernels.deno.relay`):
    # its sandbox needs a network namespace of its own
    listens_on_loopback: bool = False
    # the kernel may be missing where kernels run (R: not in a minimal image, nor on a
    # machine without R): a run is refused (400) where the backend's environment lacks it
    optional: bool = False


_DENO = LanguageTraits(
    kernel="deno",
    reads_result=True,
    fenced_output=True,
    exit_is_program_exit=True,
    interruptible=False,
    listens_on_loopback=True,
)

TRAITS: dict[Language, LanguageTraits] = {
    "python": LanguageTraits(kernel="ipykernel", reads_result=True),
    "bash": LanguageTraits(kernel="bash", reads_result=False),
    "javascript": _DENO,
    "typescript": _DENO,
    # IRkernel publishes in order before `idle` (no fences); it takes no interrupt_request
    # (it stops on SIGINT only, and only between requests): the deadline kills
    "r": LanguageTraits(kernel="irkernel", reads_result=True, interruptible=False, optional=True),
}


def traits(language: Language) -> LanguageTraits:
    return TRAITS[language]


def entrypoint_source(language: Language, path: str) -> str:
    """The cell that runs the file `path` (relative to the working folder)."""
    kernel = traits(language).kernel
    if kernel == "ipykernel":
        return f"%run -i {shlex.quote(path)}"
    if kernel == "bash":
        return f"bash {shlex.quote(path)}"
    if kernel == "irkernel":  # as `Rscript` would: visible values printed, plots drawn
        return f"source({_r_string(path)}, print.eval = TRUE)"
    # a module of its own: its globals (`globalThis`) are the notebook's
    return f"await import({json.dumps('./' + path)});"


def _r_string(text: str) -> str:
    """An R string literal: JSON's escapes are R's (no surrogate escapes: UTF-8 as is)."""
    return json.dumps(text, ensure_ascii=False)


# A notebook's metadata for each language (what a run exported as .ipynb says).
KERNELSPECS: dict[str, dict[str, Any]] = {
    "python": {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python", "file_extension": ".py", "mimetype": "text/x-python"},
    },
    "bash": {
        "kernelspec": {"name": "bash", "display_name": "Bash", "language": "bash"},
        "language_info": {"name": "bash", "file_extension": ".sh", "mimetype": "text/x-sh"},
    },
    # Deno's kernel (`deno jupyter --install` names it "deno") runs both
    "typescript": {
        "kernelspec": {"name": "deno", "display_name": "Deno", "language": "typescript"},
        "language_info": {
            "name": "typescript",
            "file_extension": ".ts",
            "mimetype": "text/x.typescript",
        },
    },
    "javascript": {
        "kernelspec": {"name": "deno", "display_name": "Deno", "language": "javascript"},
        "language_info": {
            "name": "javascript",
            "file_extension": ".js",
            "mimetype": "text/javascript",
        },
    },
    # IRkernel's kernelspec (`IRkernel::installspec()` names it "ir") and language_info
    "r": {
        "kernelspec": {"name": "ir", "display_name": "R", "language": "R"},
        "language_info": {
            "name": "R",
            "file_extension": ".r",
            "mimetype": "text/x-r-source",
            "codemirror_mode": "r",
            "pygments_lexer": "r",
        },
    },
}


def notebook_metadata(language: str) -> dict[str, Any]:
    return {key: dict(value) for key, value in KERNELSPECS[language].items()}


# Kernel names and languages a notebook may name, and the language that runs it.
KERNEL_LANGUAGES: dict[str, Language] = {
    "python": "python",
    "python3": "python",
    "ipython": "python",
    "ipython3": "python",
    "bash": "bash",
    "typescript": "typescript",
    "deno": "typescript",  # the kernel name `deno jupyter --install` gives
    "javascript": "javascript",
    "r": "r",
    "ir": "r",  # the kernel name `IRkernel::installspec()` gives
}

"""`GET /v1/environment`: what the kernels have, so that a client (or a model) knows what it
may import before it runs anything. Read from the kernels' environment itself
(`kernels/environment.py`): baked into the kernel image when it is built, or collected from
the gateway's own environment by the local backend."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from gateway.models.base import Answer
from gateway.models.common import LANGUAGES, Language
from gateway.models.languages import traits

Source = Literal["image", "local", "unknown"]


class Package(Answer):
    name: str = Field(description="as its packaging names it (a PyPI distribution, an R package)")
    version: str


class LanguageEnvironment(Answer):
    kernel: str = Field(
        description="the Jupyter kernel that runs it: `ipykernel`, `bash` (the gateway's own), "
        "`deno`, `IRkernel`"
    )
    kernel_version: str | None = Field(None, description="null where the kernel has none")
    version: str | None = Field(
        None,
        description="the language's own version: Python's, bash's, V8's for JavaScript, "
        "TypeScript's, R's",
    )
    packages: list[Package] = Field(
        description="what its code can import, by name: Python's distributions, R's "
        "installed packages; for bash the commands the manual names (python3, deno, git, R) "
        "with their versions; none for JavaScript and TypeScript (npm: and jsr: imports "
        "need a network, which runs have not)"
    )


class Environment(Answer):
    """The languages a run may ask for here, with their kernels and installed packages.
    Runs have no network: nothing can be installed at run time."""

    backend: str = Field(description="the sandbox backend whose kernels these are")
    source: Source = Field(
        description="`image`: read from the kernel image (written into it when it was built); "
        "`local`: collected from the environment the local backend runs kernels from; "
        "`unknown`: the backend could not tell (only the languages the gateway supports are "
        "listed, without packages)"
    )
    image: str | None = Field(None, description="the Docker backend's kernel image")
    profile: str | None = Field(
        None, description="the image's profile (`minimal`, `datascience`), when it has one"
    )
    collected_at: str | None = Field(None, description="when the list was made (RFC 3339)")
    languages: dict[Language, LanguageEnvironment] = Field(
        description="by language, the ones this gateway's kernels have (`javascript` and "
        "`typescript` share Deno's kernel)"
    )

    @classmethod
    def read(
        cls, found: dict[str, Any], *, backend: str, source: Source, image: str | None = None
    ) -> Environment:
        """The answer from `kernels.environment`'s JSON; pydantic's ValidationError when
        it has another shape (languages the gateway does not know are left out)."""
        raw = found.get("languages") or {}
        return cls(
            backend=backend,
            source=source,
            image=image,
            profile=found.get("profile"),
            collected_at=found.get("collected_at"),
            languages={
                language: LanguageEnvironment.model_validate(raw[language])
                for language in LANGUAGES
                if language in raw
            },
        )

    @classmethod
    def unknown(cls, backend: str) -> Environment:
        """What the gateway supports, where the backend could not tell what it has."""
        return cls(
            backend=backend,
            source="unknown",
            languages={
                language: LanguageEnvironment(kernel=traits(language).kernel, packages=[])
                for language in LANGUAGES
            },
        )

"""MkDocs hooks for the documentation site (mkdocs.yml, ``hooks:``): links to repository files,
and the docstrings' Sphinx roles.

The pages link to files of the repository outside ``docs/`` (``../examples/worker.py``,
``../BENCHMARKS.md``) so that they work where the repository is read (a forge, an editor).
The site holds only ``docs/``: such a link becomes the file's repository path in code, and a
link to a file that does not exist is a warning, which ``mkdocs build --strict`` makes an error.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.repository_links")

# [text](../path) or [text](../path#anchor), outside code spans (pages keep such links on
# one line).
_LINK = re.compile(r"\[([^\]\n]+)\]\((\.\./[^)\s#]+)(#[^)\s]*)?\)")


def on_page_markdown(markdown: str, page: Any, config: Any, **_: Any) -> str:
    source = Path(page.file.abs_src_path)
    docs = Path(config["docs_dir"]).resolve()
    root = docs.parent

    def repository_path(match: re.Match[str]) -> str:
        text, target = match.group(1), match.group(2)
        path = (source.parent / target).resolve()
        if path.is_relative_to(docs):
            return match.group(0)  # inside the site: MkDocs checks it
        if not path.is_relative_to(root) or not path.exists():
            log.warning("%s: link to %s: no such file in the repository", page.file.src_uri, target)
            return match.group(0)
        shown = path.relative_to(root).as_posix()
        return text if text.strip("`") == shown else f"{text} (`{shown}` in the repository)"

    # Leave fenced code blocks alone: only prose links are rewritten.
    parts = re.split(r"(^```.*?^```)", markdown, flags=re.MULTILINE | re.DOTALL)
    return "".join(
        part if part.startswith("```") else _LINK.sub(repository_path, part) for part in parts
    )


# The docstrings are written with Sphinx roles (:class:`~ship_sqla.errors.ShipError`), which
# mkdocstrings renders as text (":class:" then the code). Each becomes a cross-reference that
# autorefs resolves when the object is documented on the site (optional: a private path or a
# name documented nowhere stays plain code, without a warning).
_ROLE = re.compile(
    r":(?:py:)?(?:class|func|meth|data|mod|attr|exc|obj|const):<code>"
    r"(?:(?P<title>[^<&]+?) &lt;(?P<target>[\w.]+)&gt;"  # :meth:`title <path>`
    r"|(?P<short>~?)(?P<path>[\w.]+)(?P<call>\(\))?)"  # :class:`~path` or :func:`path()`
    r"</code>"
)
_API_PAGE = re.compile(r"^reference/api/(\w+)\.md$")


def on_page_content(html: str, page: Any, **_: Any) -> str:
    api = _API_PAGE.match(page.file.src_uri)
    module = None
    if api:
        module = "ship_sqla" if api.group(1) == "ship_sqla" else f"ship_sqla.{api.group(1)}"

    def reference(match: re.Match[str]) -> str:
        if match["target"]:  # :meth:`title <path>`
            path, shown = match["target"], match["title"]
        else:
            path = match["path"]
            shown = (path.rsplit(".", 1)[-1] if match["short"] else path) + (match["call"] or "")
        identifier = f"{module}.{path}" if module and "." not in path else path
        return f'<autoref identifier="{identifier}" optional><code>{shown}</code></autoref>'

    return _ROLE.sub(reference, html)

"""MkDocs hooks for the documentation site (mkdocs.yml, ``hooks:``).

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

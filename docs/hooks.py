"""MkDocs hooks of the flashsim site (``hooks:`` in mkdocs.yml). Everything here is found,
not listed, so new notebooks, pages and modules appear without editing the site:

* the home page is README.md (its links into docs/ rewritten to site links);
* every ``notebooks/*.ipynb`` becomes a page with its outputs: executed headless by
  docs/notebook_run.py (or reused from this test session or this ``mkdocs serve``) and
  rendered by mkdocs-jupyter, which shows each widget panel as the PNG it carries beside
  the widget;
* every ``docs/*.md`` is a page (measurements.md is generated from the committed data by
  docs/make_measurements.py; a test keeps it current);
* the API reference is one page per public module of flashsim and gpu_kernels, rendered
  from the docstrings by mkdocstrings;
* the navigation: Home, the notebooks, the other pages, the API reference.
"""

from __future__ import annotations

import os
import pathlib
import re
import time

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

import notebook_run   # docs/ is on sys.path while MkDocs loads this file

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("flashsim", "gpu_kernels")

# Reuse what this process (or the test session that started it) executed: a plain
# `mkdocs build` executes every notebook; `mkdocs serve` does once, then only edited ones.
os.environ.setdefault(notebook_run.SINCE_ENV, repr(time.time()))


def modules(package: str) -> list[str]:
    """Dotted names of a package's public modules (no ``_private`` file or folder)."""
    names = []
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(p.startswith("_") for p in parts) or parts[-1] == "__main__":
            continue
        names.append(".".join(parts))
    return names


def _home_page() -> str:
    """README.md with its links fitted to the site: docs/X becomes X; a link to any other
    file of the repository (not on the site) becomes its text and the path."""
    def link(m: re.Match) -> str:
        bang, text, target = m.groups()
        if target.startswith(("http://", "https://", "mailto:", "#")):
            return m.group(0)
        if target.startswith("docs/"):
            return f"{bang}[{text}]({target[len('docs/'):]})"
        if target.startswith("notebooks/") and target.endswith(".ipynb"):
            return f"{bang}[{text}]({target})"
        return f"{text} (`{target}`)"
    return re.sub(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)", link, (ROOT / "README.md").read_text())


@event_priority(100)   # before mkdocs-jupyter turns .ipynb files into pages
def on_files(files: Files, config) -> Files:
    files.append(File.generated(config, "index.md", content=_home_page()))

    tour = []
    for source in notebook_run.notebooks():
        copy = notebook_run.executed(source, after=notebook_run.since())
        # A File on disk, not File.generated: mkdocs-jupyter reads the path from src_dir.
        uri = f"{copy.parent.name}/{copy.name}"                 # notebooks/NAME.ipynb
        files.append(File(uri, src_dir=str(copy.parent.parent), dest_dir=config.site_dir,
                          use_directory_urls=config.use_directory_urls))
        tour.append(uri)

    api = {}
    for package in PACKAGES:
        for name in modules(package):
            uri = f"api/{name}.md"
            files.append(File.generated(config, uri, content=f"# `{name}`\n\n::: {name}\n"))
            api.setdefault(package, []).append({name: uri})

    pages = sorted(f.src_uri for f in files.documentation_pages()
                   if "/" not in f.src_uri and f.src_uri not in ("index.md", "notebooks.md"))
    config["nav"] = [{"Home": "index.md"},
                     {"Notebooks": ["notebooks.md", *tour]},
                     *pages,
                     {"API reference": [{p: entries} for p, entries in api.items()]}]
    return files

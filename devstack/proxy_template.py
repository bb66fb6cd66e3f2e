"""The few rules deploy/nginx/*.conf templates are filled by (dlock.conf.tmpl's header).

`{{include FILE}}` on a line of its own: FILE (relative to deploy/nginx/, `{{NAME}}` values
allowed in it) without its opening comment, each line indented as the include line.
`{{if NAME}}`, `{{if not NAME}}`, `{{else}}`, `{{end}}` on lines of their own: the lines
between kept or dropped by NAME's yes/no value. `{{NAME}}` anywhere else: NAME's value, as is.
Nothing else: the files are nginx text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from devstack.common import PROJECT

DIRECTORY = PROJECT / "deploy" / "nginx"
_INCLUDE = re.compile(r"^(?P<indent>\s*)\{\{include (?P<name>\S+)\}\}\s*$")
_SECTION = re.compile(r"^\s*\{\{(?P<word>if not|if|else|end)(?: (?P<name>\w+))?\}\}\s*$")
_VALUE = re.compile(r"\{\{(\w+)\}\}")
Values = Mapping[str, str | bool]


def _substitute(text: str, values: Values, where: Path) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values or isinstance(values[name], bool):
            raise ValueError(f"{where}: no value for {{{{{name}}}}}")
        return str(values[name])

    return _VALUE.sub(value, text)


def _expand(path: Path, values: Values, indent: str | None = None) -> list[str]:
    """The file's lines with its includes expanded (sections and values still to fill); an
    included file without its opening comment (what the file is: for its reader)."""
    own = path.read_text().splitlines()
    if indent is not None:
        while own and own[0].startswith("#"):
            own.pop(0)
    indent = indent or ""
    lines: list[str] = []
    for line in own:
        match = _INCLUDE.match(line)
        if match:
            name = _substitute(match["name"], values, path)
            lines += _expand(DIRECTORY / name, values, indent + match["indent"])
        else:
            lines.append(indent + line if line else line)
    return lines


def _sections(lines: list[str], values: Values, where: Path) -> list[str]:
    """The lines whose every enclosing section is kept."""
    kept: list[str] = []
    stack: list[bool] = []  # per open section: whether its current branch is kept
    for line in lines:
        match = _SECTION.match(line)
        if not match:
            if all(stack):
                kept.append(line)
            continue
        word, name = match["word"], match["name"]
        if word in ("if", "if not"):
            if name not in values or not isinstance(values[name], bool):
                raise ValueError(f"{where}: {{{{if {name}}}}} needs a yes/no value")
            stack.append(bool(values[name]) != (word == "if not"))
        elif not stack:
            raise ValueError(f"{where}: {{{{{word}}}}} outside a section")
        elif word == "else":
            stack[-1] = not stack[-1]
        else:
            stack.pop()
    if stack:
        raise ValueError(f"{where}: {{{{if}}}} without {{{{end}}}}")
    return kept


def render(template: Path, values: Values) -> str:
    text = "\n".join(_sections(_expand(template, values), values, template)) + "\n"
    text = _substitute(text, values, template)
    if "{{" in text:
        raise ValueError(f"unfilled placeholder in {template}: {text[text.index('{{') :][:40]}")
    return text

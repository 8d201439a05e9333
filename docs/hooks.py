"""MkDocs hooks: the pages that are generated from the code, so that they cannot drift from it.

``<!-- generated: cli -->`` becomes the reference of every ``tfrepro`` command, read from the argument
parser the command line itself uses; ``<!-- generated: exit-codes -->`` becomes the table of
``tfrepro.cli.exit_codes.ExitCode``. Neither imports TensorFlow.
"""

from __future__ import annotations

import argparse
import inspect


def _cell(text: str) -> str:
    """One table cell: one line, pipes escaped (a pipe inside a code span needs no escape)."""
    parts = " ".join(str(text).split()).split("`")
    return "`".join(part if i % 2 else part.replace("|", "\\|") for i, part in enumerate(parts))


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    metavar = ""
    if action.nargs != 0:
        metavar = " " + (action.metavar or (f"{{{','.join(map(str, action.choices))}}}" if action.choices else
                                            action.dest.upper()))
    return ", ".join(f"`{flag}{metavar}`" for flag in action.option_strings)


def command_reference(build_parser=None) -> str:
    """The Markdown reference of every command of ``tfrepro``'s parser: usage, description, options."""
    if build_parser is None:
        from tfrepro.cli.commands import build_parser
    parser = build_parser()
    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in commands._choices_actions}
    out = []
    for name, sub in commands.choices.items():
        summary = _cell(helps.get(name, ""))
        out += [f"## `tfrepro {name}`", "", summary[:1].upper() + summary[1:] + ".", "",
                "```text", sub.format_usage().strip(), "```", "", _cell(sub.description or ""), ""]
        rows = [action for action in sub._actions
                if not isinstance(action, argparse._HelpAction) and action.help != argparse.SUPPRESS]
        if rows:
            out += ["| argument | meaning | default |", "|---|---|---|"]
            for action in rows:
                default = action.default
                shown = "" if default in (None, False, argparse.SUPPRESS) or action.nargs == argparse.REMAINDER \
                    else f"`{default}`"
                out.append(f"| {_cell(_flags(action))} | {_cell(action.help or '')} | {shown} |")
            out.append("")
    return "\n".join(out)


def exit_code_table() -> str:
    """The Markdown table of ``ExitCode``: value, name and meaning, from the enum's own docstrings."""
    import ast

    from tfrepro.cli import exit_codes

    tree = ast.parse(inspect.getsource(exit_codes))
    docs: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "ExitCode":
            body = node.body
            for assign, doc in zip(body, body[1:]):
                if isinstance(assign, ast.Assign) and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant):
                    docs[assign.targets[0].id] = doc.value.value
    rows = ["| code | name | meaning |", "|---|---|---|"]
    rows += [f"| `{int(code)}` | `{code.name}` | {_cell(docs.get(code.name, ''))} |" for code in exit_codes.ExitCode]
    return "\n".join(rows)


def on_page_markdown(markdown: str, **kwargs) -> str:
    if "<!-- generated: cli -->" in markdown:
        markdown = markdown.replace("<!-- generated: cli -->", command_reference())
    if "<!-- generated: exit-codes -->" in markdown:
        markdown = markdown.replace("<!-- generated: exit-codes -->", exit_code_table())
    return markdown

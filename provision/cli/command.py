"""The command class every `mgpu-cloud` command uses: its help and how it reads a script line.

Help: a command's first sentence whole in the top-level list (never cut with "..."); options
in titled groups (each option's `rich_help_panel`: cluster, provider, job, ...), shown in plain
text, with Click's value names (TEXT, INTEGER) instead of Python type names.

A script line (`run [OPTIONS] SCRIPT [ARGS]...`, `launch NAME [OPTIONS] SCRIPT [ARGS]...`): the
tool's options come before the script, every word after it is the script's. A word before the
script that is no option of the command is a typo (`--nodse 2`): Click refuses it with "No such
option: --nodse (Possible options: --nodes, ...)", exit 2, before anything runs. A word after
the script that is one of the command's own options gets a warning (it goes to the script),
unless a `--` before the script says that this is meant.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperCommand

if TYPE_CHECKING:  # typer carries its own copy of Click; its types, for the checker only
    from typer._click import Context, HelpFormatter, Parameter

SCRIPT = "script"  # the name of the argument that starts the script's own words
OTHER_OPTIONS = "Options"


def first_sentence(text: str) -> str:
    """The first sentence of a help text, whole (one paragraph, joined)."""
    paragraph = " ".join(text.strip().split("\n\n")[0].split())
    match = re.search(r"[.!?](\s|$)", paragraph)
    return paragraph[: match.end()].strip() if match else paragraph


class MgpuCommand(TyperCommand):
    """A Typer command with the help and script-line rules of the module docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.metavar is None:
                param.metavar = _value_name(param)

    def get_short_help_str(self, limit: int = 45) -> str:
        if self.short_help or not self.help:
            return super().get_short_help_str(limit)
        return first_sentence(self.help)

    def format_options(self, ctx: Context, formatter: HelpFormatter) -> None:
        args: list[tuple[str, str]] = []
        panels: dict[str, list[tuple[str, str]]] = {OTHER_OPTIONS: []}
        for param in self.get_params(ctx):
            if _is_argument(param):  # its name only: Typer would add `<str>` after it
                more = "..." if param.nargs != 1 else ""
                required = "  [required]" if param.required else ""
                args.append((f"{param.metavar}{more}", f"{getattr(param, 'help', '')}{required}"))
                continue
            record = param.get_help_record(ctx)
            if record is not None:
                panel = getattr(param, "rich_help_panel", None) or OTHER_OPTIONS
                panels.setdefault(panel, []).append(record)
        if args:
            with formatter.section("Arguments"):
                formatter.write_dl(args)
        for title, records in panels.items():
            if records:
                with formatter.section(title):
                    formatter.write_dl(records)

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        if any(_is_argument(p) and p.name == SCRIPT for p in self.params):
            args = self._script_line(ctx, args)
        try:
            return super().parse_args(ctx, args)
        except Exception as exc:
            # Click's NoSuchOption (typer may carry its own Click: matched by name) suggests
            # close spellings only; `--nprocs` should also get `--nproc-per-node`.
            name = getattr(exc, "option_name", None)
            if type(exc).__name__ == "NoSuchOption" and name and not exc.possibilities:  # type: ignore[attr-defined]
                exc.possibilities = _longer_options(name, self._option_words(ctx))  # type: ignore[attr-defined]
            raise

    def _script_line(self, ctx: Context, args: list[str]) -> list[str]:
        """`args` with a `--` put before the script, so that Click gives every word after it
        to the script. Unchanged when the user wrote `--` there, or when a word before the
        script is no option of this command (Click then refuses it by name)."""
        takes_value = self._option_words(ctx)
        before = [p.name for p in self.params if _is_argument(p)].index(SCRIPT)
        positionals = 0
        i = 0
        while i < len(args):
            word = args[i]
            if word == "--":
                return args
            if word.startswith("-") and word != "-":
                width = _option_width(word, takes_value)
                if width is None:
                    return args  # not an option of this command: Click names it
                i += width
                continue
            if positionals == before:
                if not ctx.resilient_parsing:
                    _warn_about_options_after(ctx, word, args[i + 1:], takes_value)
                return [*args[:i], "--", *args[i:]]
            positionals += 1
            i += 1
        return args

    def _option_words(self, ctx: Context) -> dict[str, bool]:
        """Every option word of this command -> whether a value follows it."""
        out: dict[str, bool] = {}
        for param in self.get_params(ctx):
            if param.param_type_name == "option":
                for word in [*param.opts, *param.secondary_opts]:
                    out[word] = not _is_flag(param)
        return out


def _longer_options(word: str, options: dict[str, bool]) -> list[str]:
    """The long options that start with `word` without its last letters (`--nprocs` ->
    `--nproc-per-node`), sharing at least 5 letters with it."""
    stem = word[:-1]
    while len(stem) > 6 and not any(o.startswith(stem) for o in options):
        stem = stem[:-1]
    return sorted(o for o in options if o.startswith("--") and len(stem) > 6
                  and o.startswith(stem))


def _option_width(word: str, takes_value: dict[str, bool]) -> int | None:
    """How many words the option `word` spans (1, or 2 with its value), None when `word` is
    not an option of the command. Forms: --name, --name=V, --name V, -x, -xV, -x V, -xyz."""
    if word.startswith("--"):
        name, eq, _ = word.partition("=")
        if name not in takes_value:
            return None
        return 2 if takes_value[name] and not eq else 1
    flag = word[:2]
    if flag not in takes_value:
        return None
    if takes_value[flag]:
        return 2 if len(word) == 2 else 1
    rest = [f"-{c}" for c in word[2:]]  # -dy: a cluster of flags
    return 1 if all(takes_value.get(f) is False for f in rest) else None


def _warn_about_options_after(ctx: Context, script: str, words: list[str],
                              takes_value: dict[str, bool]) -> None:
    ours = [w for w in words if w.startswith("-") and w.partition("=")[0] in takes_value]
    if not ours:
        return
    listed = ", ".join(dict.fromkeys(w.partition("=")[0] for w in ours))
    command = ctx.command_path
    typer.echo(
        f"warning: {script} gets {listed}: the words after the script are its own\n"
        f"  {command}'s options go before the script; to pass {listed} to the script\n"
        f"  on purpose, put `--` before it: {command} [OPTIONS] -- {script} ...",
        err=True,
    )


def _is_argument(param: Parameter) -> bool:
    return param.param_type_name == "argument"


def _is_flag(param: Parameter) -> bool:
    return bool(getattr(param, "is_flag", False) or getattr(param, "count", False))


_VALUE_NAMES = {int: "INTEGER", float: "FLOAT", str: "TEXT"}


def _value_name(param: Parameter) -> str | None:
    """Click's own names (TEXT, INTEGER, FLOAT; SCRIPT for an argument), not Python's."""
    if _is_argument(param):
        return (param.name or "").upper() or None
    if _is_flag(param):
        return None
    annotation: Any = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    if getattr(annotation, "__origin__", None) is list:  # list[str]: a repeatable option
        annotation = annotation.__args__[0]
    return _VALUE_NAMES.get(annotation, "VALUE")

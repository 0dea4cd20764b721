"""The Typer app and the helpers every command shares: error handling and option tables.

Start-up cost matters (`mgpu-cloud --help` < 0.25 s): only typer is imported at the top of the
CLI modules; pydantic, rich, fabric and the cloud SDKs are imported inside the commands.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import typer

from provision.cli.command import MgpuCommand


class App(typer.Typer):
    """typer.Typer whose commands are MgpuCommand (help, typos, options after the script)."""

    def command(self, *args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:  # type: ignore[override]  # the same parameters, passed on
        kwargs.setdefault("cls", MgpuCommand)
        return super().command(*args, **kwargs)


app = App(
    name="mgpu-cloud",
    help="Distributed PyTorch training from one GPU to many nodes and back to zero cost.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"mgpu-cloud {version('mgpu-cloud')}")
        raise typer.Exit()


@app.callback()
def _top(
    show_version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                      help="print the version and exit"),
) -> None:
    """Distributed PyTorch training from one GPU to many nodes and back to zero cost."""


@dataclass
class Opt:
    """One option of a command: its parameter, and where its value goes in the spec.

    `path` is the key path in ClusterSpec/JobSpec (empty: handled by the command itself);
    `by_provider` (provider flags): provider -> field of that provider's options model."""

    name: str
    annotation: Any
    option: Any
    path: tuple[str, ...] = ()
    by_provider: dict[str, str] = field(default_factory=dict)


def fail(exc: BaseException) -> None:
    from provision.model.errors import MgpuError

    if isinstance(exc, MgpuError):
        typer.echo(f"error: {exc.message}", err=True)
        if exc.hint:
            typer.echo(f"  hint: {exc.hint}", err=True)
        raise typer.Exit(exc.exit_code)
    raise exc


def note_skipped(unreadable: list[Any], effect: str = "left out of this list") -> None:
    """Name each inventory a command could not read (InventoryUnreadableError: path, line,
    the fix) and what that meant for its output (`effect`), on stderr."""
    for exc in unreadable:
        typer.echo(f"warning: {exc.message}; cluster {exc.cluster!r} {effect}", err=True)
        if exc.hint:
            typer.echo(f"  hint: {exc.hint}", err=True)


def guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn MgpuError into a message + exit code; Ctrl-C into exit 130, SIGTERM into 143."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from provision.cluster.pipeline import Terminated
        from provision.model.errors import MgpuError

        try:
            return fn(*args, **kwargs)
        except MgpuError as exc:
            fail(exc)
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            raise typer.Exit(130) from None
        except Terminated:
            typer.echo("terminated", err=True)
            raise typer.Exit(143) from None

    return wrapper


def with_options(options: list[Opt], bucket: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Append `options` to a command's signature; the command receives them as one dict."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn)
        own = [p for p in sig.parameters.values() if p.name != bucket]
        extra = [
            inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.option,
                              annotation=o.annotation)
            for o in options
        ]
        names = {o.name for o in options}

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            values = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
            kwargs[bucket] = {**kwargs.get(bucket, {}), **values}
            return fn(*args, **kwargs)

        wrapper.__signature__ = sig.replace(parameters=own + extra)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {
            **{k: v for k, v in fn.__annotations__.items() if k != bucket},
            **{o.name: o.annotation for o in options},
        }
        return wrapper

    return decorate


def load_provider_commands() -> None:
    """Add each provider's own sub-commands (ProviderInfo.commands: name -> "module:app"), with
    the CLI's error handling (`guard`) around each: a provider's commands module is plain typer
    and imports nothing of this layer."""
    from provision.model.registry import all_provider_infos, load_ref

    for info in all_provider_infos():
        for name, ref in info.commands:
            sub: typer.Typer = load_ref(ref)
            for command in sub.registered_commands:
                if command.callback is not None:
                    command.callback = guard(command.callback)
            app.add_typer(sub, name=name)

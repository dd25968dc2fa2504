"""The listings' light console prints rich's markup as rich would (text and styles)."""

from __future__ import annotations

import io

import click
import pytest
from rich.console import Console
from rich.markup import escape as rich_escape

from kdtree.orchestrator.markup import MarkupConsole, escape, render

USER_TEXT = ["plain", "a [bold] word", "[/dim] closes", "C:\\path\\", "x\\[y]", "\\\\[red]z", "[x", "a]b",
             "[link=http://e.com]", "back\\slash at end\\", "[#ff0000]hex[/]", "émoji :smile: ✓"]


def rich_plain(markup: str) -> str:
    buf = io.StringIO()
    Console(file=buf, color_system=None, highlight=False, soft_wrap=True, emoji=False, width=200).print(markup)
    return buf.getvalue()


@pytest.mark.parametrize("text", USER_TEXT)
def test_escape_is_riches(text):
    assert escape(text) == rich_escape(text)


@pytest.mark.parametrize("text", USER_TEXT)
def test_escaped_user_text_prints_as_itself(text):
    markup = f"[bold]{escape('gate')}[/bold]  [red]{escape(text)}[/red] [dim]{escape(text)}[/dim]"
    assert click.unstyle(render(markup)) + "\n" == rich_plain(markup)
    assert click.unstyle(render(markup)) == f"gate  {text} {text}"


def test_styles_become_ansi_styles():
    assert render("[bold red]error[/bold red] ok") == click.style("error", fg="red", bold=True) + " ok"
    assert render("[green]a[dim]b[/dim]c[/green]") == (click.style("a", fg="green")
                                                       + click.style("b", fg="green", dim=True)
                                                       + click.style("c", fg="green"))


def test_a_closed_pipe_is_a_broken_pipe(monkeypatch):
    def closed(*args, **kwargs):
        raise BrokenPipeError

    monkeypatch.setattr(click, "echo", closed)
    with pytest.raises(BrokenPipeError):
        MarkupConsole().print("[bold]x[/bold]")


def test_status_listing_reads_as_with_rich(project, monkeypatch):
    """The whole `status` listing of a project with runs is the text rich printed for it."""
    from kdtree.orchestrator import display  # noqa: PLC0415

    project.knobs(p1={"speed": "fail"})
    project.cli("run", "p1", expect=1)
    ours = project.cli("status").output
    printed: list[str] = []

    class Recorder:
        def print(self, markup: str = "") -> None:
            printed.append(rich_plain(markup))

    monkeypatch.setattr(display, "listing_console", Recorder)
    project.cli("status")
    assert ours == "".join(printed) and "failed" in ours and "speedup 1.5x >= 3x (miss)" in ours


def test_status_imports_neither_rich_nor_jinja2(project):
    """`orchestrate status` as a user starts it loads no rich, jinja2 or torch (it starts fast)."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    project.cli("run", "p1")
    probe = ("import sys\nsys.argv = ['orchestrate', 'status']\nfrom kdtree.orchestrator.cli import main\n"
             "try:\n    main()\nexcept SystemExit as exc:\n    code = exc.code\n"
             "print('LOADED', sorted(m for m in ('rich', 'jinja2', 'torch') if m in sys.modules), code)")
    done = subprocess.run([sys.executable, "-c", probe], cwd=project.root, capture_output=True, text=True,
                          timeout=120)
    assert "p1 alpha  passed" in done.stdout, done.stdout + done.stderr
    assert "LOADED [] 0" in done.stdout

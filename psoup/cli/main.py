"""The `psoup` command: thin click commands that call the library (STYLE.md, "click").

Only `demo` exists so far; the service issue adds serve, register, invoke, watch and the
rest of API.md's commands.
"""

from __future__ import annotations

import click

from psoup import MODES, __version__
from psoup.cli.demo import run_demo


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="psoup")
def main() -> None:
    """psoup: register standing queries over streams, disconnect, and invoke them later."""


@main.command()
@click.option("--mode", type=click.Choice(MODES), default="partial",
              show_default=True, help="Engine mode: PSoup-P, PSoup-C or NoMat.")
@click.option("--rows", type=click.IntRange(100, 10_000_000), default=20_000, show_default=True,
              help="Traffic readings per phase of the demo.")
@click.option("--seed", type=int, default=7, show_default=True, help="Seed of the synthetic trace.")
def demo(mode: str, rows: int, seed: int) -> None:
    """Run the embedded engine on a synthetic traffic trace; no server needed.

    Registers sliding, landmark and snapshot queries, ingests readings, "disconnects"
    while more data arrives, then invokes every handle and prints the answers.
    """
    run_demo(mode=mode, rows=rows, seed=seed, echo=click.echo)


if __name__ == "__main__":
    main()

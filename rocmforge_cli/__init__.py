"""rocmforge's command line: the Typer app, argument parsing, rendering and exit codes only."""

"""The command line: every command module (`HELP`, `add_arguments(parser)`, `run(args) -> int`) and the entry
point (`main`). Nothing in the package imports this folder."""

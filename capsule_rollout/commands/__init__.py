"""What every command is made of, below the entry points: its named config (frozen dataclasses, standard
library only so the CLI stays fast), its registration (`@command`), the dotted command line built from the
configs, and the result an entry point returns. `cli/` holds the runners and `cli.run`."""

"""`python -m capsule_rollout NAME [--field value ...] [--json PATH]`: the project's commands."""

from capsule_rollout.cli.run import cli

if __name__ == "__main__":
    cli()

"""``python -m recon.cli``: the same as the ``recon`` command."""

from recon.cli import run

run()

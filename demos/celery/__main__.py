"""``python -m demos.celery``: runs the demo and exits with its status."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())

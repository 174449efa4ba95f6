"""The demos, run from a checkout (they are not part of the installed package).

``python -m demos.celery`` (``make demo``): two real Celery workers under bursts of calls.
``python -m demos.core`` (``make demo-core``): the lock core alone, four processes contending.
``_common`` holds what both demos and ``examples/`` share: child processes and interval maths.
See ``demos/README.md``.
"""

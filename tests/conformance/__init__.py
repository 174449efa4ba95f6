"""One table of scenarios run against Celery tasks and RQ jobs alike (tests/conformance/).

A package (not a plain folder of tests) so that its ``conftest`` does not take the place of
``tests/conftest.py`` in ``sys.modules`` under pytest's prepend import mode.
"""

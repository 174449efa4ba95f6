"""The soak: two Celery workers under chaos (kills, lost replies) for minutes, then a verdict on
what ran: nothing lost, no two holders at once. Run it as ``python benchmarks/soak`` (``make
soak``); ``__main__`` reads the arguments, ``session`` runs one soak, ``soakapp`` is the app the
workers run (as ``soak.soakapp``, with ``benchmarks/`` on their ``PYTHONPATH``)."""

"""``python -m celery_redislock.cli``: the ``redislock`` console script."""

from . import main

main()

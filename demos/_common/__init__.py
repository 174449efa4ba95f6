"""What both demos, ``examples/`` and the soak benchmark share: ``processes`` (children stopped
however the parent ends) and ``spans`` (how many intervals were in progress at once)."""

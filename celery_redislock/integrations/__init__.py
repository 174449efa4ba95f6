"""Framework integrations: each sub-package glues the core to one task framework."""

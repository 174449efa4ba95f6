"""The one place the version is written (read by the build and by ``__version__``)."""

__version__ = "0.1.0"

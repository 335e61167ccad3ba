"""The SDK's version, read by the packaging metadata and sent in the `User-Agent` header."""

__version__ = "0.1.0"

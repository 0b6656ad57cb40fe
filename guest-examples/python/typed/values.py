"""componentize-py looks for an exported interface's resources in the
module named after the interface."""

from app import Counter  # noqa: F401

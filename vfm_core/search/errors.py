"""The one exception of clip search a user can cause (bad query, unknown clip, bad manifest)."""

from __future__ import annotations

from vfm_core.errors import UserError


class SearchError(UserError, ValueError):
    """A search input that cannot be served, naming the input; ``vfm`` prints it as one line."""

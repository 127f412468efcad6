"""Strategy search: space, analytic screen, layer assignment, placement, exact re-rank, store.

The package is also the function ``distir.api.search``: ``distir.search(model=..., cluster=...,
batch=...)`` runs a search. A function attribute ``search`` on ``distir`` would break
``import distir.search.run as run`` (that import looks the submodule up as an attribute), so the
package's module object is made callable instead (module ``__class__`` assignment, Python 3.5+).
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distir.api import SearchResults


class _SearchPackage(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> SearchResults:
        """``distir.api.search``: find the fastest strategy that fits."""
        from distir.api import search

        return search(*args, **kwargs)


sys.modules[__name__].__class__ = _SearchPackage

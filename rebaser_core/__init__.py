"""rebaser_core: the wire contract shared by client and server.

Ids (:mod:`.ids`), subjects and names (:mod:`.subjects`), stream configurations (:mod:`.streams`), tunables
(:mod:`.settings`), headers (:mod:`.headers`), versioned messages (:mod:`.api`) and the error tree
(:mod:`.errors`). :mod:`.embedded` runs a real nats-server; :mod:`.testing` holds the pytest fixtures.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
    from rebaser_core.settings import Settings
    from rebaser_core.subjects import Subjects

__all__ = ["ChangeSetId", "RequestId", "Settings", "Subjects", "WorkspacePk"]
__version__ = "0.1.0"

# Each name is imported when first used: every module of the package (rebaser_core.errors too) runs this file first,
# and the command lines (``rebaser --help``) must not pay for pydantic's settings model then.
_WHERE = {
    "ChangeSetId": "rebaser_core.ids",
    "RequestId": "rebaser_core.ids",
    "Settings": "rebaser_core.settings",
    "Subjects": "rebaser_core.subjects",
    "WorkspacePk": "rebaser_core.ids",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'rebaser_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

"""rebaser_core: the wire contract shared by client and server.

Ids (:mod:`.ids`), subjects and names (:mod:`.subjects`), stream configurations (:mod:`.streams`), tunables
(:mod:`.settings`), headers (:mod:`.headers`), versioned messages (:mod:`.api`) and the error tree
(:mod:`.errors`). :mod:`.embedded` runs a real nats-server; :mod:`.testing` holds the pytest fixtures.
"""

from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.settings import Settings
from rebaser_core.subjects import Subjects

__all__ = ["ChangeSetId", "RequestId", "Settings", "Subjects", "WorkspacePk"]
__version__ = "0.1.0"

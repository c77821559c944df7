"""radiology: lesion growth over a live Orthanc DICOM server, with typed DICOM tools.

Each task is a few synthetic patients with a current and a prior study (:mod:`.studies`,
made with pydicom): CT or MR in the ``lesion_growth`` track, chest radiographs in the
``nodule_dx`` track (:mod:`.suite` lists each track's traps; :mod:`.teacher` plays them,
:mod:`.agreement` scores them), stored on the env's own Orthanc
(:mod:`.orthanc`, :mod:`.service`) and exported under ``data/dicom``. Besides
``execute_code`` the agent has typed DICOM tools (:mod:`.tools`): find studies and
series, read headers, fetch a window/levelled slice, measure a region, store an
annotation, submit a structured finding. The server's state (studies, annotations,
findings) is part of every stage state, capped in size (:mod:`.service`). What the agent
stores through the tools is scored against the verifier's own measurement, never its
claims (:mod:`.checks`). Needs Debian's ``orthanc`` package
(``apt-get update && apt-get install -y orthanc``).

Why typed tools and not an MCP server mounted as a tool set: an MCP server's tool
list would plug into :class:`bat_gym.core.tools.Tool` easily (its ``inputSchema`` is JSON
Schema, and a handler could forward ``tools/call`` under the call's remaining time),
but it buys this suite nothing it needs and costs what the gym guarantees. The reward
rests on evidence the env records and the verifier recomputes; the typed tools refuse
a malformed UID before any request, name the fix in a :class:`~bat_gym.core.tools.ToolError`,
and write records only through the service, which caps their size and journals them
for an exact, incremental reset. A mounted server is a second process with state of its
own: it would have to be a :class:`~bat_gym.core.service.ServiceState` (snapshot and restore
of its data, or GRPO groups would not start from one state), a hung call could only be
stopped by killing it (and losing that state), its free-form results and loosely typed
schemas would need the same caps and strict models anyway, and most servers assume a
network the sandboxes do not have. Mounting MCP servers is worth it only as an opt-in
adapter for a domain whose only interface is an MCP server, run locally over stdio as
the benchmark's service, with each of its tools re-declared with a strict model; for
DICOM over Orthanc's REST API the seven tools here are the smaller and safer path.
"""

from bat_gym.envs.radiology.suite import Radiology

__all__ = ["Radiology", "benchmark"]


def benchmark() -> Radiology:
    """Entry point for the ``bat_gym.benchmarks`` group."""
    return Radiology()

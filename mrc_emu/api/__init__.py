"""A pure-Python mirror of the OCP MRC APIs (mrc_ctl.h, mrc.h): a controller per host with its EV
format, EV and CC profiles, EV operations and events, ports and endpoint batches, and its QPs.

Why it exists: users coming from the OCP MRC specification expect its controller model, with its
names: an EV format profile (STEV, SRV6, UDP; field widths), an EV profile (AUTO, EXP, GEN; fields
with width, init_val, min_val, max_val, mask) and their INIT/OFFLINE/ONLINE lifecycles, and the
expansion of a compact EV into the 32 bytes a packet carries. Modules: `errors` (one exception
type per kind of failure, each with the errno the header gives), `formats` (EV format profiles),
`profiles` (EV profiles and their restrictions), `expansion` (compact EV -> 32 bytes, the EVs a
GEN or EXP profile yields), `files` (the profile YAML file), `evops` (REPLACE_EV, MODIFY_EV_STATE,
QUERY_EV_STATE, QUERY_EV_ARRAY in batches; EV state lives in the profile), `events` (EV states and
the bounded EV event queue), `cc` (CC profiles: algorithm name and NSCC config), `ports` (port
admin state), `qp` (an MRC QP: RST -> INIT -> RTR -> RTS with each transition's attributes, the
work-request rules, the config the transport takes), `endpoint` (the EV_PROBE /
PORT_STATUS_UPDATE batch and its req_ids), `controller` (one host's device attributes and
limits, profiles by id, QPs bound to them). See docs/api.md.

What it must never do: touch the system or import the fabric, the drivers (io), the transport or
the experiments; it is pure data and arithmetic, like the topology model it sits beside. The
transport and the experiments layer read it (a QP's transport_config(), the profiles' EV states).
"""

from .cc import CcProfile
from .controller import Controller, CtlDeviceAttr, OptAttr, port_mask
from .endpoint import EpBatch, EpOpType, EpRequest, EpResponse, ReqIdPool
from .errors import MrcApiError, RestrictionError
from .events import EvEvent, EvEventQueue, EvState
from .evops import EvOp, EvOpEntry, EvOpError, EvOpFlag, device_set_state, ev_op
from .expansion import ExpandedEv, expand, explicit_evs, generated_evs, srv6_address
from .formats import EV_MAX_BYTES, EvFormatMode, EvFormatProfile, ProfileState
from .ports import PortAdmin, PortAdminState, PortState
from .profiles import EvEventMask, EvField, EvProfile, EvProfileMode
from .qp import DeviceAttr, DeviceCap, NoReceivePosted, Qp, QpAttr, QpCap, QpHint, QpState, RetryCnt, WrOpcode

__all__ = [
    "Controller", "CtlDeviceAttr", "OptAttr", "port_mask",
    "EpBatch", "EpOpType", "EpRequest", "EpResponse", "ReqIdPool",
    "DeviceAttr", "DeviceCap", "NoReceivePosted", "Qp", "QpAttr", "QpCap", "QpHint", "QpState", "RetryCnt", "WrOpcode",
    "CcProfile", "PortAdmin", "PortAdminState", "PortState",
    "EvEvent", "EvEventQueue", "EvOp", "EvOpEntry", "EvOpError", "EvOpFlag", "EvState", "device_set_state", "ev_op",
    "EV_MAX_BYTES", "EvEventMask", "EvField", "EvFormatMode", "EvFormatProfile", "EvProfile", "EvProfileMode",
    "ExpandedEv", "MrcApiError", "ProfileState", "RestrictionError", "expand", "explicit_evs", "generated_evs",
    "srv6_address",
]

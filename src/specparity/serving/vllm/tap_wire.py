"""What the gate and the tap (serving/vllm/tap.py) say to each other through vLLM's ``collective_rpc``: the worker
methods' names and the keys of the batch facts each recorded call carries.

Names, not pickled functions: vLLM's front end refuses to serialise functions unless
VLLM_ALLOW_INSECURE_SERIALIZATION is set (vllm 0.32 v1/serial_utils.py:219). A leaf module, so that the gate's side
(ranks.py, live.py), the tap and its reduction (tap_reduce.py) share them without importing each other.
"""

from __future__ import annotations

RPC = "specparity_tap_drain"  # hand over what was recorded since the last drain
ARM = "specparity_tap_arm"  # install (once) and start recording; kwargs atlas="1"|"" (strings: the HTTP route's rule)
DISARM = "specparity_tap_disarm"
DESCRIBE = "specparity_tap_describe"  # the deployment as this worker's own VllmConfig resolves it (JSON)
EXPECT = "specparity_tap_expect"  # the next probe's recorded fc input, sources and rtol (reduced evidence)
# the batch facts each recorded call carries (tap.py's module docstring)
IDS_KEY, POSITIONS_KEY, QSL_KEY = "tap/ids", "tap/positions", "tap/qsl"

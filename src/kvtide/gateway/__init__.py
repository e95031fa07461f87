"""The gateway: an asyncio OpenAI-compatible edge that routes each request to an engine replica
through the same ``kvtide.routing`` objects the simulator uses.

Start it with ``kvtide serve`` or ``serve(GatewayConfig(...))``; build the app in-process with
``build_app`` (tests, embedding).
"""

from kvtide.gateway.config import GatewayConfig, ReplicaSpec, load_config
from kvtide.gateway.server import build_app, serve

__all__ = ["GatewayConfig", "ReplicaSpec", "build_app", "load_config", "serve"]

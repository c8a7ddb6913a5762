# --- afterthought: --memory_service_uri afterthought:// (afterthought adk init) ---
from afterthought.agent_hooks.adk_services import register as _register_afterthought

_register_afterthought()
# --- end of afterthought ---

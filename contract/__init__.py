"""Records that cross a process boundary, defined once.

Engine, gateway, regional agent and control plane import these modules and
none of each other's internals: lease records with their Redis key layout and
Lua scripts (`lease`), the routing snapshot (`snapshot`), engine identity
(`identity`), data-plane events (`events`) and the OpenAI-compatible request
surface the gateway and engines speak (`openai`). It imports only `common`.
"""

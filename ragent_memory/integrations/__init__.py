"""Adapters for the frameworks agents are built in (DESIGN §14b), each an optional extra:

- ``ragent_memory.integrations.langchain`` — ``RagentMemoryMiddleware`` for ``create_agent``
  (extra ``langchain``)
- ``ragent_memory.integrations.pydantic_ai`` — ``history_processor`` for ``pydantic_ai.Agent``
  (extra ``pydantic-ai``)
- ``ragent_memory.integrations.openai_agents`` — ``RagentSession`` for the OpenAI Agents SDK
  (extra ``openai-agents``)

Each converts the framework's messages to chat dicts, runs ``prepare`` before the model call,
registers the engine's tools (answered through :func:`ragent_memory.engine.tools.call_tool`) and feeds
``after_turn``. The caller's history in the framework is never changed: only what the model
sees is.
"""

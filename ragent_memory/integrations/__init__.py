"""Adapters for the frameworks agents are built in (docs/design.md §14b), each an optional extra:

- ``langchain`` — ``RagentMemoryMiddleware`` for ``create_agent`` (extra ``langchain``)
- ``pydantic_ai`` — ``history_processor`` for ``pydantic_ai.Agent`` (extra ``pydantic-ai``)
- ``openai_agents`` — ``RagentSession`` for the OpenAI Agents SDK (extra ``openai-agents``)

Each runs ``prepare`` before the model call, registers the engine's tools and feeds
``after_turn``; the framework's own history is never changed, only what the model sees."""

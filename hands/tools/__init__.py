"""The tools room: how tools are declared (``declare``: the ``@tool`` decorator, the context a
body gets, and ``@policy`` for a framework's tools) and found again by a pool (``registry``), from
``@tool`` functions, MCP servers (``mcp``) or the agents of Pydantic AI and the OpenAI Agents SDK
(``frameworks``)."""

"""``ragent-memory serve``, the proxy (docs/design.md §14b): the ASGI app (``app``) speaking
three wire formats (``chat``, ``anthropic``, ``responses`` over ``wire``), one turn through
the engine and the upstream (``turn``, ``upstream``, ``stream``), the proxy's own tools
answered wherever the model calls them (``own_tools``, ``splice``), who a request speaks for
(``identity``), and the bounds on what a caller can make it hold (``connections``, ``http``,
``bodies``)."""
